"""Full per-parameter tensors -> one live stage engine of any layout (tp, dp, ep, ZeRO 0/1/2; ZeRO 3 for a
stage with experts over ep, whose checkpoints are ds_hetero's own: zero3_state.py).

Each rank cuts its tp shard out of every full tensor with the same split the layers use
(`shard_tensor`, after the vocabulary padding the head adds), then hands it to DeepSpeed:
the model weight directly, the fp32 master weight and Adam's moments through DeepSpeed's
public `safe_set_full_fp32_param` / `safe_set_full_optimizer_state` (which keep just this
rank's ZeRO partition of the tp shard). ZeRO 0 has a plain torch optimizer: its per-parameter
state is written as torch's Adam keeps it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..expert_parallel.gather import expert_block
from ..tensor_parallel.layers import shard_tensor
from .expert_state import expert_slot
from .full_state import MOMENTS
from .manifest import CheckpointError
from .zero3_state import write_entry


def split_full(full: torch.Tensor, param: torch.nn.Parameter, tp_rank: int, tp: int) -> torch.Tensor:
    """This rank's shard of `full`, shaped like `param` (pads the vocabulary the head padded; an
    expert weight sharded over ep: this rank's experts, replicated over tp)."""
    if getattr(param, "expert_parallel", False):
        return expert_block(full, param.ep_dim, param.ep_outer, expert_slot(param), param.ep_size)
    if not getattr(param, "tensor_model_parallel", False) or tp == 1:
        return full
    dim, stride = param.partition_dim, param.partition_stride
    want = getattr(param, "ds_shape", param.shape)[dim] * tp  # ZeRO 3 keeps only a partition in param
    if full.shape[dim] < want:  # VocabParallelLMHead(pad_vocab=True): zero rows at the end
        pad = list(full.shape)
        pad[dim] = want - full.shape[dim]
        full = torch.cat([full, full.new_zeros(pad)], dim)
    return shard_tensor(full, dim, tp_rank, tp, stride)


def _set_group_steps(zero_optimizer, module_params: dict[str, torch.nn.Parameter], steps: dict[str, float],
                     step: float) -> None:
    """Each flat ZeRO 1/2 group holding `module_params` continues at their step count (`step` where
    none is recorded); a group whose parameters were saved at different counts cannot hold them."""
    name_of = {id(p): n for n, p in module_params.items()}
    base = zero_optimizer.optimizer
    for group, flat in zip(zero_optimizer.bit16_groups, zero_optimizer.single_partition_of_fp32_groups):
        if not any(id(p) in name_of for p in group):  # another stage's group of a shared engine: its own call
            continue
        counts = {steps.get(name_of.get(id(p)), step) for p in group}
        if len(counts) > 1:
            raise CheckpointError(
                f"parameters saved at different optimizer step counts {sorted(counts)} (a stage without work in "
                f"some steps) share one ZeRO parameter group here; load into a layout that keeps each stage's "
                f"parameters in groups of their own")
        state = base.state.get(flat)
        if counts and state and "step" in state:  # kept as the optimizer keeps it (torch: a float tensor)
            old, value = state["step"], counts.pop()
            state["step"] = (torch.tensor(value, dtype=old.dtype, device=old.device) if torch.is_tensor(old)
                             else type(old)(value))


def _step_value(optimizer, step: float):
    """A step count as `optimizer` keeps it: torch's Adam a float tensor (on the CPU unless
    capturable/fused), DeepSpeed's FusedAdam and CPU Adam a Python int."""
    if type(optimizer).__module__.startswith("torch.optim"):
        return torch.tensor(float(step), dtype=torch.float32)
    return int(step)


def _link_zero_optimizer_state(zero_optimizer, moments: tuple[str, ...]) -> None:
    """Give a ZeRO 1/2 optimizer that has not stepped yet its (flat) Adam state, linked to the params.

    DeepSpeed creates the base optimizer's state and links each parameter's view of it
    (`_hp_mapping.optim_fragment`) only at the first step; its universal-checkpoint loader
    builds them itself (BaseOptimizer.load_hp_checkpoint_state_from_checkpoint_dir). We do the
    same before `safe_set_full_optimizer_state` can write through those views: zero state per
    flat fp32 partition, then DeepSpeed's own linking (`_lazy_init_hp_params_optimizer_state`).
    """
    base = zero_optimizer.optimizer
    for flat in zero_optimizer.single_partition_of_fp32_groups:
        if not base.state.get(flat):
            base.state[flat] = {"step": _step_value(base, 0),
                                **{k: torch.zeros_like(flat) for k in moments}}
    zero_optimizer._hp_optimizer_states_linked = False
    zero_optimizer._lazy_init_hp_params_optimizer_state()


def _restore_lr(scheduler) -> None:
    """The learning rate the restored scheduler gives, written into its optimizer's groups.

    A scheduler's state_dict holds its position, not the optimizer's lr: DeepSpeed's own load
    restores the lr with the optimizer's state_dict, which a layout change does not load (its
    param groups are the new layout's). DeepSpeed's schedulers compute the next lr from their
    position (`get_lr`); torch's keep it (`_last_lr`, one per group: one value for all when the
    saved layout had another number of groups and all of them the same lr)."""
    if hasattr(scheduler, "last_batch_iteration") and hasattr(scheduler, "get_lr"):  # DeepSpeed's lr_schedules
        lrs = list(scheduler.get_lr())
    else:
        lrs = list(getattr(scheduler, "_last_lr", None) or [])
    groups = scheduler.optimizer.param_groups
    if lrs and len(lrs) != len(groups) and len(set(lrs)) == 1:
        lrs = lrs[:1] * len(groups)
    if len(lrs) == len(groups):
        for group, lr in zip(groups, lrs):
            group["lr"] = lr


@torch.no_grad()
def apply_full_state(engine, module_params: dict[str, torch.nn.Parameter], state: dict[str, Any],
                     tp_rank: int, tp: int, zero: int) -> None:
    """Load `state` (stage_full_state) into `engine`, whose module's parameters are `module_params`."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    full = state["params"]
    optimizer = engine.optimizer
    step = state.get("step")
    steps = state.get("param_steps") or {}  # per parameter (an older cache: none, the stage's one step)
    if zero in (1, 2):
        _link_zero_optimizer_state(optimizer, MOMENTS)
    for name, param in module_params.items():
        entry = full[name]
        shard = split_full(entry["fp32"], param, tp_rank, tp).to(param.device)
        has_moments = param.requires_grad and "exp_avg" in entry
        moments = {k: split_full(entry[k], param, tp_rank, tp).to(param.device) for k in MOMENTS} if has_moments else None
        if zero == 3:  # this rank's partitions of the weight, the master and the moments (an ep stage's load)
            write_entry(engine, param, shard, moments, steps.get(name, step))
            continue
        param.data.copy_(shard.to(param.dtype))
        if not has_moments:
            continue
        if zero == 0:
            optimizer.state[param] = {"step": _step_value(optimizer, steps.get(name, step)),
                                      **{k: v.to(param.dtype).clone() for k, v in moments.items()}}
        else:
            safe_set_full_fp32_param(param, shard)
            for key, value in moments.items():
                safe_set_full_optimizer_state(param, value, key)
    if zero in (1, 2) and step is not None:
        _set_group_steps(optimizer, module_params, steps, step)
    scheduler = engine.lr_scheduler
    if scheduler is not None and state.get("lr_scheduler") is not None:
        scheduler.load_state_dict(state["lr_scheduler"])
        _restore_lr(scheduler)
    for key in ("global_steps", "global_samples", "skipped_steps"):
        if state.get(key) is not None:
            setattr(engine, key, state[key])
