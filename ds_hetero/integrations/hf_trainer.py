"""The Hugging Face Trainer, heterogeneous: `HeteroTrainer` in place of `Trainer`.

    args = TrainingArguments(..., deepspeed="ds_configs/llava_colocated.json")
    trainer = ds_hetero.HeteroTrainer(model=model, args=args, train_dataset=data, eval_dataset=held_out)
    trainer.train()                                      # one Trainer step = one ds_hetero optimizer step
    trainer.save_model("out/final")                      # consolidated HF checkpoint

Why a Trainer subclass and not a callback: a callback never receives the Trainer, can hand back
only control flags, and by `on_train_begin` the Trainer has already built a whole-model
DeepSpeedEngine (shared/reference/hf-trainer-accelerate.md). `HeteroCallback` is therefore a
guard: in a stock `Trainer` it stops the run at construction, on every rank, saying to write
`HeteroTrainer`; in a HeteroTrainer it does nothing. Without the callback, a stock Trainer given
a `hetero_parallel` config is stopped by the `deepspeed.initialize` guard (integrations/guard.py)
when `train()` builds its engine, as soon as the script has imported ds_hetero.

What the subclass overrides (the smallest surface that works; two are private hooks):
    _wrap_model         builds the HeteroEngine from the DeepSpeed config the Trainer filled
                        ("auto" values from TrainingArguments) and hands back `HeteroModel`
    create_scheduler    the HF scheduler drives `HeteroOptimizer`, a live view of every stage
                        optimizer's param_groups (DeepSpeed's load_checkpoint replaces the group
                        dicts, so a copied list would go stale after a resume)
    training_step       `engine.train_batch(global batch)`; the step's all-stage grad norm reaches
                        the Trainer's `grad_norm` through accelerate's DeepSpeed hook
    get_train_dataloader the global batch, the same on every rank, in ds_hetero's data order
                        (`GlobalBatchLoader.indices`, seed = data_seed or seed): the same
                        batches `ds_hetero.initialize(..., training_data=)` would draw
    evaluate            `engine.eval_batch` per global batch, label-token weighted: eval_loss is
                        the single-process model's loss on the same samples
    save_model          `engine.save_pretrained` (TP and ZeRO gathered, HF names)
    log                 adds the per-stage metrics (integrations/metrics.py) to loss logs
Checkpoints (`save_steps`, `save_total_limit`, `resume_from_checkpoint`) go through the
Trainer's own DeepSpeed branch: `HeteroModel.save_checkpoint/load_checkpoint` write and read
ds_hetero's per-stage checkpoint in `checkpoint-N/global_stepN`, next to the consolidated HF
weights, the HF scheduler state and the trainer state the Trainer writes itself.

Dataset items are ds_hetero samples (per-sample dicts: input_ids, labels, image fields); the
engine pads them, so `data_collator` is not used.
"""

from __future__ import annotations

import glob
import math
import os
import time

import torch
from torch.utils.data import BatchSampler, DataLoader
from transformers import Trainer, TrainerCallback

from ..errors import HeteroConfigError
from ..data.loader import GlobalBatchLoader
from ..loss import label_token_count
from .ds_config import is_derived_mismatch, trainer_ds_config
from .metrics import StepMetrics


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


class _NormSource:
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
        self._engines = [s.engine for s in engine.stages.training]  # a frozen stage has no optimizer
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


def _as_list(samples):
    return list(samples)


class HeteroCallback(TrainerCallback):
    """A guard: in a stock `transformers.Trainer` it stops the run at construction (see the module doc)."""

    def on_init_end(self, args, state, control, **kwargs):
        if not getattr(self, "_in_hetero_trainer", False):
            raise HeteroConfigError(
                "callbacks", "HeteroCallback cannot make a stock transformers.Trainer heterogeneous (a callback never "
                "receives the Trainer, and the Trainer builds a whole-model DeepSpeed engine before any callback "
                "could act). Write `trainer = ds_hetero.HeteroTrainer(...)` in place of `trainer = Trainer(...)` "
                "(same arguments)")
        return control


class HeteroTrainer(Trainer):
    """`transformers.Trainer` over a HeteroEngine; `TrainingArguments(deepspeed=...)` carries `hetero_parallel`."""

    def __init__(self, *args, weights=None, **kwargs):
        """`weights`: a Hugging Face safetensors checkpoint directory for a model built on the meta
        device (`ds_hetero.meta_model(path)`): every rank reads only its stages' tp shards of it,
        as `ds_hetero.initialize(..., weights=)` does."""
        self._hetero_weights = weights
        callbacks = [cb() if isinstance(cb, type) and issubclass(cb, HeteroCallback) else cb
                     for cb in kwargs.get("callbacks") or []]
        for cb in callbacks:
            if isinstance(cb, HeteroCallback):
                cb._in_hetero_trainer = True  # the guard has nothing to stop here
        if callbacks:
            kwargs["callbacks"] = callbacks
        super().__init__(*args, **kwargs)
        if not self.is_deepspeed_enabled or self.args.deepspeed is None:
            raise HeteroConfigError(
                "TrainingArguments.deepspeed", "HeteroTrainer needs TrainingArguments(deepspeed=<DeepSpeed JSON path "
                "or dict with a hetero_parallel section>)")
        # Every conflict now, on every rank, before any collective (the Trainer itself would raise
        # its mismatches only at train(), and would not know ours).
        self._hetero_config, _ = trainer_ds_config(self.args)
        # The per-device micro batch and accumulation are per stage in ds_hetero (its config checks
        # them); keep the Trainer's deepspeed_init from re-raising its own comparison of them.
        hf_config = self.args.hf_deepspeed_config
        hf_config.mismatches = [m for m in hf_config.mismatches if not is_derived_mismatch(m)]
        self.hetero: HeteroModel | None = None
        self._hetero_metrics = StepMetrics()

    # ------------------------------------------------------------------ engine
    @property
    def hetero_engine(self):
        """The HeteroEngine (built on first use: train, evaluate or save)."""
        return self._ensure_engine().engine

    def _ensure_engine(self) -> HeteroModel:
        if self.hetero is not None:
            return self.hetero
        from ..entry import initialize

        cfg = self._hetero_config
        # The Trainer fills its remaining "auto" values (ZeRO bucket sizes) in deepspeed_init at
        # train(); outside train() (evaluate or save first) fill them here the same way.
        hf_config = self.args.hf_deepspeed_config
        hf_config.trainer_config_finalize(self.args, self.model, 0)
        cfg = {**cfg, "zero_optimization": hf_config.config.get("zero_optimization", cfg.get("zero_optimization"))}
        factory = None
        if "optimizer" not in cfg:  # TrainingArguments.optim for every stage, as the Trainer would build it
            cls, kw = self.get_optimizer_cls_and_kwargs(self.args, self.model)
            factory = lambda params: cls(params, **kw)  # noqa: E731
            cfg["zero_allow_untested_optimizer"] = True
        engine = initialize(self.model, cfg, optimizer=factory, seed=self._data_seed(),
                                      weights=self._hetero_weights)
        self.hetero = HeteroModel(engine)
        self.accelerator.deepspeed_engine_wrapped = _NormSource(self.hetero)
        return self.hetero

    def _data_seed(self) -> int:
        return self.args.data_seed if self.args.data_seed is not None else self.args.seed

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        if training:
            return self._ensure_engine()
        return self.hetero if self.hetero is not None else model

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.hetero is not None and not isinstance(self.optimizer, HeteroOptimizer):
            self.optimizer, self.lr_scheduler = HeteroOptimizer(self.hetero.engine), None
        return super().create_scheduler(num_training_steps, optimizer=self.optimizer)

    # ------------------------------------------------------------------ step
    def training_step(self, model, inputs, num_items_in_batch=None):
        r = model.engine.train_batch(inputs)
        model.last = r
        self._hetero_metrics.add(r)
        return torch.tensor(r.loss, device=self.args.device)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self.hetero is not None and self._hetero_metrics.steps:
            logs.update(self._hetero_metrics.reduce(self.hetero.engine.groups.boundary))
        super().log(logs, start_time)

    # ------------------------------------------------------------------ data
    def _global_batch_size(self) -> int:
        return self.args.per_device_train_batch_size * self.args.world_size  # == DS train_batch_size

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ValueError("HeteroTrainer: training requires a train_dataset")
        sampler = GlobalBatchSampler(self.train_dataset, self._global_batch_size(), self._data_seed())
        # Not accelerator-prepared: every rank takes the same global batch; the engine gives each
        # stage's dp ranks their shares.
        return GlobalBatchDataLoader(self.train_dataset, batch_sampler=sampler, collate_fn=_as_list)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """eval_loss = (token losses of the whole eval set) / (its label tokens), as one forward of the
        single-process model over all of it would give; the same on every rank."""
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("HeteroTrainer: evaluation requires an eval_dataset")
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        engine = self._ensure_engine().engine
        start = time.time()
        size = engine.config.global_batch_size
        loss_sum, n_labels, n_batches = 0.0, 0, 0
        for first in range(0, len(dataset), size):
            samples = [dataset[i] for i in range(first, min(first + size, len(dataset)))]
            n = sum(label_token_count(s["labels"]) for s in samples)
            if n:
                loss_sum += engine.eval_batch(samples) * n
                n_labels += n
            n_batches += 1
        runtime = time.time() - start
        metrics = {
            f"{metric_key_prefix}_loss": loss_sum / n_labels if n_labels else math.nan,
            f"{metric_key_prefix}_runtime": round(runtime, 4),
            f"{metric_key_prefix}_samples_per_second": round(len(dataset) / runtime, 3),
            f"{metric_key_prefix}_steps_per_second": round(n_batches / runtime, 3),
        }
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # ------------------------------------------------------------------ export
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """A consolidated Hugging Face checkpoint of the current weights; every rank must call it."""
        from transformers.trainer import TRAINING_ARGS_NAME

        output_dir = output_dir or self.args.output_dir
        if self.hetero is None:  # nothing built yet: the model is still whole
            if self.args.should_save:
                self.model.save_pretrained(output_dir)
        else:
            self.hetero.engine.save_pretrained(output_dir)
        if self.args.should_save:
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
            torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))
