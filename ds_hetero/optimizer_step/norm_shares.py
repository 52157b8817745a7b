"""A ZeRO 1/2 stage's squared gradient norm as per-rank shares, summed in the step's one all-reduce.

DeepSpeed's `scaled_global_norm` computes each rank's part of the norm over its dp partition,
then all-reduces it over the stage's data-parallel group and again over its model-parallel
group: two collectives per stage engine, before ds_hetero's own all-reduce combines the stages
(global_step.combine_norms_and_loss). Where every element of the stage's gradient is counted by
exactly one rank of the stage, those per-engine all-reduces are redundant: each rank's share of
the squared norm can go straight into the combining all-reduce, which sums over every rank of
every stage anyway. A share counts what DeepSpeed's `get_grad_norm_direct` counts on this rank
(the rank's dp partition; a tensor-parallel shard on every tp rank, a replicated parameter on tp
rank 0 only; no pipeline-replicated or shared tied copy), in the dtype DeepSpeed's norm uses.

That "exactly one rank" holds when the stage's ranks (per pipeline stage, whose engine holds
only its own layers) are exactly the engine's dp group times its model-parallel group. Anything
else keeps DeepSpeed's own norm (clipping.stage_norm): ZeRO 0 and 3, optimizer offload, experts
sharded over ep (their gradients are reduced over other groups), Muon groups whose update lacks
the loss scale, a layout with a replicated axis outside those two groups.

On the quick benchmark sizes this removes two of the step's eight collectives (docs/benchmarks.md).
The sum runs in another order than DeepSpeed's (fp32 shares summed in fp64 across ranks, instead
of an fp32 all-reduce per group): the norm agrees to rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..stages.tied_embeddings import is_shared_copy
from .clipping import is_zero12


def _engine_ranks(opt) -> int:
    """The ranks DeepSpeed's own norm sums over: its dp group (None is the world, as DeepSpeed
    reads it) times its model-parallel group (None: no model parallelism, DeepSpeed's `is_parallel`)."""
    mp = opt.model_parallel_group
    return dist.get_world_size(opt.dp_process_group) * (dist.get_world_size(mp) if mp is not None else 1)


def shares_norm(stage) -> bool:
    """Whether this stage's norm can be summed from per-rank shares (see the module docstring).
    The same answer on every rank of the stage: it depends on the layout, the config and the
    parameters' kinds only, so the engine asks once, when it is built (`sharing_stages`)."""
    opt = stage.engine.optimizer
    if not is_zero12(opt) or opt.cpu_offload or getattr(opt, "has_moe_layers", False):
        return False
    if any(getattr(p, "expert_parallel", False) for group in opt.bit16_groups for p in group):
        return False
    ranks_per_pipeline_stage = len(stage.layout.ranks) // stage.layout.pp
    return _engine_ranks(opt) == ranks_per_pipeline_stage


def sharing_stages(stages) -> frozenset[str]:
    """The trained stages held here whose norm comes from shares (global_step.stage_norms)."""
    return frozenset(stage.name for stage in stages.training if shares_norm(stage))


def shares_this_step(opt) -> bool:
    """False for a step where a Muon group's update lacks the loss scale (fp16 with Muon: DeepSpeed
    scales such a group's norm itself in `scaled_global_norm`), the same on every rank."""
    lacks_scale = getattr(opt, "_muon_update_lacks_loss_scale", None)
    return lacks_scale is None or not any(lacks_scale(i) for i in range(len(opt.bit16_groups)))


def norm_sq_share(opt) -> torch.Tensor:
    """This rank's share of a ZeRO 1/2 engine's squared gradient norm: a 0-dim fp32 tensor on
    the gradients' device (no host read), as `get_grad_norm_direct` sums it before its all-reduces."""
    from deepspeed.runtime.constants import PIPE_REPLICATED
    from deepspeed.runtime.utils import is_model_parallel_parameter
    from deepspeed.runtime.zero.utils import get_norm_dtype

    dtype, counted = get_norm_dtype(), []
    for i, params in enumerate(opt.params_in_partition):  # averaged_gradients: {param group: partition grads}
        grads = [g for g in opt.averaged_gradients[i] if not getattr(g, "_zero_padding", False)]
        for g, p in zip(grads, params):
            if getattr(p, PIPE_REPLICATED, False) or is_shared_copy(p):
                continue
            if is_model_parallel_parameter(p) or opt.model_parallel_rank == 0:
                # a gradient carries no autograd history; converted only where its dtype differs
                # (each conversion costs a few microseconds of host time, per tensor, every step)
                counted.append(g if g.dtype == dtype else g.to(dtype))
    if not counted:
        return torch.zeros((), dtype=torch.float32, device=opt.device)
    return torch.stack(torch._foreach_norm(counted)).pow(2).sum().float()
