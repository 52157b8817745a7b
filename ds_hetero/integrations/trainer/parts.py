"""The pieces the Trainer holds in place of a DeepSpeedEngine and its optimizer, and the global-batch sampler.

    HeteroModel        `model_wrapped` / `self.deepspeed`: DeepSpeed's checkpoint API over the engine
    NormSource         accelerate's DeepSpeedEngineWrapper stand-in: the step's all-stage grad norm
    HeteroOptimizer    a live view over every stage optimizer's param_groups (the HF scheduler drives it)
    GlobalBatchSampler the dataset indices of each ds_hetero step, the same on every rank
"""

from __future__ import annotations

import glob
import os

import torch
from torch.utils.data import BatchSampler, DataLoader

from ...data.loader import GlobalBatchLoader


class HeteroModel(torch.nn.Module):
    """What the Trainer holds as `model_wrapped` / `self.deepspeed`: DeepSpeed's checkpoint API over the engine."""

    def __init__(self, engine):
        super().__init__()
        self.engine = engine
        self.last = None  # the last StepResult

    def parameters(self, recurse: bool = True):
        # Parameter counts in logs; not registered as submodules (the stage engines own them).
        seen = set()
        for e in self.engine.engines.values():
            for p in e.module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    def zero_grad(self, set_to_none: bool = True):  # train_batch stepped and zeroed every stage engine
        pass

    def save_checkpoint(self, output_dir, **_):  # Trainer._save_optimizer_and_scheduler, DeepSpeed branch
        self.engine.save_checkpoint(os.path.join(output_dir, f"global_step{self.engine.global_steps}"))

    def load_checkpoint(self, path, **_):  # transformers' deepspeed_load_checkpoint (globs path/global_step*)
        found = sorted(glob.glob(os.path.join(path, "global_step*")), key=lambda p: int(p.rsplit("step", 1)[1]))
        if not found:
            raise FileNotFoundError(f"no ds_hetero checkpoint (global_step*) in {path}")
        self.engine.load_checkpoint(found[-1])
        return found[-1], {}


class NormSource:
    """Stands in for accelerate's DeepSpeedEngineWrapper: `clip_grad_norm_` returns the last all-stage norm."""

    def __init__(self, model: HeteroModel):
        self.model, self.engine = model, self  # Accelerator.free_memory() calls .engine.destroy()

    def get_global_grad_norm(self):
        return None if self.model.last is None else self.model.last.grad_norm

    def backward(self, loss, sync_gradients=True, **kwargs):
        pass

    def destroy(self):
        pass


class HeteroOptimizer(torch.optim.Optimizer):
    """A live view over every stage optimizer's param_groups, so an HF LR scheduler drives them all."""

    def __init__(self, engine):
        # a frozen stage has no optimizer; stages sharing one engine share its optimizer (once)
        self._engines = [s.engine for s in engine.stages.stepping]
        super().__init__([torch.zeros(1, requires_grad=True)], {"lr": 0.0})

    @property
    def param_groups(self):
        return [g for e in self._engines for g in e.optimizer.param_groups]

    @param_groups.setter
    def param_groups(self, value):  # Optimizer.__init__ assigns []; the stage engines own the groups
        pass

    def step(self, closure=None):  # the stage engines stepped inside train_batch
        return None

    def zero_grad(self, set_to_none: bool = True):
        pass

    def state_dict(self):  # saved with the stage engines' checkpoints, not by the Trainer
        return {}

    def load_state_dict(self, state_dict):
        pass


class GlobalBatchSampler(BatchSampler):
    """Epoch e, batch k: the dataset indices of ds_hetero step e * steps_per_epoch + k."""

    def __init__(self, dataset, global_batch_size: int, seed: int):
        self.order = GlobalBatchLoader(dataset, global_batch_size, seed=seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        first = self.epoch * self.order.steps_per_epoch
        for k in range(self.order.steps_per_epoch):
            yield self.order.indices(first + k)

    def __len__(self) -> int:
        return self.order.steps_per_epoch


class GlobalBatchDataLoader(DataLoader):
    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class SamplerBatches(BatchSampler):
    """Global batches in the order of a sampler the Trainer subclass gives (`_get_train_sampler`
    overridden, e.g. LLaMA-Factory's sequential order): consecutive runs of `global_batch_size`
    indices, the last partial one dropped. The order must be the same on every rank (RankBatch
    checks it every step)."""

    def __init__(self, sampler, global_batch_size: int):
        self.sampler, self.size = sampler, global_batch_size

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        batch = []
        for index in self.sampler:
            batch.append(int(index))
            if len(batch) == self.size:
                yield batch
                batch = []

    def __len__(self) -> int:
        return len(self.sampler) // self.size


class IndexDataset(torch.utils.data.Dataset):
    """Positions only: the rows are read later, on each rank only as far as its stages need (RankBatch)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class GlobalBatch(list):
    """The dataset indices of one step (a list, so the Trainer's label counting skips it)."""
