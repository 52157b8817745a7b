"""One parameter of a ZeRO 3 engine, read and written whole by name (an ep stage's checkpoints: expert_state.py,
reshard.py).

Under ZeRO 3 each parameter is a flat partition over its partition group (dp for dense parameters, the
expert-data-parallel group for experts: DeepSpeed's MoE groups), padded to a multiple of the group's size:
the model's weight in `param.ds_tensor`, the fp32 master and Adam's moments in the flat fp32 sub-group
that holds it (`fp32_partitioned_groups_flat`, at `grad_position`). Reading gathers with DeepSpeed's
public `safe_get_full_fp32_param` / `safe_get_full_optimizer_state` (an all-gather over the partition
group; a frozen parameter, which has no master, through `GatheredParameters`). Writing is local: each
rank copies its partition's slice of the full tensor into the model's partition and the master and
moments. DeepSpeed's `set_full_hp_param` would do the master and moments, but narrows the unpadded full
tensor at the padded offset (out of range on the last rank when the group does not divide the parameter)
and leaves the model's partition as it was; both are done here, from the same offsets.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

MOMENTS = ("exp_avg", "exp_avg_sq")


def _sub_group_state(optimizer, param) -> dict[str, Any]:
    """The base optimizer's state of the fp32 sub-group holding `param` (empty before the first step)."""
    sub, _, _ = optimizer.grad_position[optimizer.get_param_id(param)]
    return optimizer.optimizer.state.get(optimizer.fp32_partitioned_groups_flat[sub], {})


def read_entry(engine, param) -> tuple[dict[str, torch.Tensor], float | None]:
    """(param whole over ZeRO: its fp32 weight, and Adam's moments once it has stepped; the step count).
    Collective over the param's partition group."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    if not param.requires_grad:
        with deepspeed.zero.GatheredParameters([param]):
            return {"fp32": param.detach().float().clone()}, None
    state = _sub_group_state(engine.optimizer, param)
    entry = {"fp32": safe_get_full_fp32_param(param).float().clone()}
    if "exp_avg" not in state:  # no step taken yet
        return entry, None
    entry.update({k: safe_get_full_optimizer_state(param, k).float().clone() for k in MOMENTS})
    return entry, float(state["step"])


def _partition(full: torch.Tensor, group, size: int) -> torch.Tensor:
    """This rank's `size` elements of `full` flattened and zero-padded to the partition group's whole."""
    rank, ranks = dist.get_rank(group=group), dist.get_world_size(group=group)
    flat = full.reshape(-1)
    padded = torch.cat([flat, flat.new_zeros(size * ranks - flat.numel())])
    return padded.narrow(0, size * rank, size)


def set_model_partition(param, values: torch.Tensor) -> None:
    """The model's own partition of `param` (what the forward gathers); one function, so that a negative
    control can leave it as it was (as DeepSpeed's `set_full_hp_param` alone would)."""
    param.ds_tensor.data.copy_(values.to(param.ds_tensor.device, param.ds_tensor.dtype))


@torch.no_grad()
def write_entry(engine, param, weight: torch.Tensor, moments: dict[str, torch.Tensor] | None,
                step: float | None) -> None:
    """Set `param` (its whole tp / ep shard `weight`, and `moments` of the same shape) into this rank's
    partitions. No communication."""
    optimizer = engine.optimizer
    group = optimizer._get_param_partition_group(param)  # dp, or the experts' expert-data-parallel group
    set_model_partition(param, _partition(weight, group, param.ds_tensor.numel()))
    if not param.requires_grad:
        return
    sub, offset, size = optimizer.grad_position[optimizer.get_param_id(param)]
    flat = optimizer.fp32_partitioned_groups_flat[sub]
    flat.data.narrow(0, offset, size).copy_(_partition(weight, group, size).to(flat.device, flat.dtype))
    if not moments:
        return
    state = optimizer.optimizer.state.setdefault(flat, {})
    if "exp_avg" not in state:  # torch's Adam makes its state at the first step: made here, as it would
        state.update({"step": torch.tensor(0.0), **{k: torch.zeros_like(flat) for k in MOMENTS}})
    for key, value in moments.items():
        state[key].narrow(0, offset, size).copy_(_partition(value, group, size).to(flat.device, flat.dtype))
    if step is not None:
        old = state["step"]
        state["step"] = (torch.tensor(float(step), dtype=old.dtype, device=old.device) if torch.is_tensor(old)
                         else type(old)(step))
