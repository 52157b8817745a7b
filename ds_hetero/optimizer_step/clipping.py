"""Gradient clipping by the norm over all stages, as for one model.

Each DeepSpeed engine can only see its own stage's gradients, so it would clip by the stage's
norm. ds_hetero turns engine clipping off (`HeteroConfig.stage_ds_config`) and instead:

1. asks every stage engine for its gradient norm, through DeepSpeed's own norm code where it
   has one (ZeRO 1/2/3 count each parameter once: tp-sharded parameters on every tp rank,
   replicated ones on tp rank 0, then sum over the dp and model-parallel groups);
2. combines them: `global = sqrt(sum_stages norm_s^2)`;
3. lets each engine step with that global norm in place of its own and with the configured
   clipping value, so DeepSpeed's usual unscale-and-clip applies `clip / (global + 1e-6)`.

Step 3 replaces one method on the engine's optimizer *instance* for the duration of one step
(`scaled_global_norm` for ZeRO 1/2, `_get_norm_groups` for ZeRO 3) and restores it after: the
narrowest hook DeepSpeed 0.19 offers, and it keeps overflow checks, loss scaling and the
optimizer's partitioned state in DeepSpeed's hands. ZeRO stage 0 with an fp32 torch optimizer
has no such method: there ds_hetero computes the norm from `param.grad` and scales the
gradients itself before `engine.step()`.

A step whose all-stage norm is not finite is skipped by every stage engine, whatever its own
gradients: `engine.step()` then takes DeepSpeed's own overflow path (nothing applied,
gradients zeroed, `skipped_steps` + 1, `global_steps` + 1, lr scheduler held), forced per
optimizer kind by `overflow_forced` (a stage with finite gradients would otherwise apply a
step clipped by an infinite norm, and a ZeRO-0 torch optimizer has no overflow check at all).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Mapping

import torch
import torch.distributed as dist

from ..errors import HeteroConfigError
from ..stages.tied_embeddings import is_shared_copy, zero12_norm_without_shared


def is_zero12(opt) -> bool:
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    return isinstance(opt, DeepSpeedZeroOptimizer)


def _is_zero3(opt) -> bool:
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    return isinstance(opt, DeepSpeedZeroOptimizer_Stage3)


def check_supported(engine, stage: str) -> None:
    """Refuse an optimizer wrapper whose clipping ds_hetero cannot make global."""
    opt = engine.optimizer
    if is_zero12(opt) or _is_zero3(opt) or isinstance(opt, torch.optim.Optimizer):
        return
    raise HeteroConfigError(
        "zero_optimization.stage",
        f"stage {stage!r}: DeepSpeed wrapped its optimizer in {type(opt).__name__}, whose gradient "
        "clipping cannot span all stages; use ZeRO stage 1 or 2 with bf16, or fp32 with any stage",
    )


def _manual_norm_sq(engine, tp_group) -> torch.Tensor:
    """Squared norm of an fp32 ZeRO-0 engine's (already dp-averaged) gradients, each counted once."""
    from deepspeed.runtime.utils import is_model_parallel_parameter

    params = [p for p in engine.module.parameters() if p.grad is not None]
    tp_rank = dist.get_rank(tp_group) if tp_group is not None else 0
    device = next(engine.module.parameters()).device
    total = torch.zeros((), dtype=torch.float64, device=device)
    # experts sharded over ep (expert_parallel/): each rank of an ep group holds other experts,
    # replicated over tp and the expert-data-parallel group: counted on tp rank 0, summed over ep
    ep_group = next((p.ep_group for p in engine.module.parameters() if getattr(p, "expert_parallel", False)), None)
    experts = torch.zeros((), dtype=torch.float64, device=device)
    for p in params:
        if is_shared_copy(p):  # the last pipeline stage's copy of a tied weight: counted on the first
            continue
        if getattr(p, "expert_parallel", False):
            if tp_rank == 0:
                experts += p.grad.detach().double().pow(2).sum()
            continue
        # tp replicas hold identical gradients of replicated parameters: count them once
        if is_model_parallel_parameter(p) or tp_rank == 0:
            total += p.grad.detach().double().pow(2).sum()
    if ep_group is not None:
        dist.all_reduce(experts, group=ep_group)
        total += experts
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(total, group=tp_group)
    return total


def stage_norm(engine, tp_group) -> torch.Tensor:
    """This stage's gradient norm (as the loss scaler sees it: scaled), identical on its ranks: a
    0-dim tensor where the engine computed it, not read to the host (the step's one host read is
    that of the all-reduce combining every stage's norm with the loss)."""
    opt = engine.optimizer
    if is_zero12(opt):
        without_shared = zero12_norm_without_shared(opt)  # a tied weight's second copy counts once
        return opt.scaled_global_norm() if without_shared is None else without_shared
    if _is_zero3(opt):
        from deepspeed.runtime.utils import combine_grad_norm_groups

        return combine_grad_norm_groups(opt._get_norm_groups())
    return _manual_norm_sq(engine, tp_group).sqrt()  # float64: sqrt rounds as math.sqrt does


def global_norm(stage_norms: Mapping[str, float]) -> float:
    """The norm of all stages' gradients together.

    DeepSpeed reports an invalid norm (inf/NaN) as -1; any invalid stage makes the whole
    norm invalid, so every stage takes the same overflow decision.
    """
    norms = list(stage_norms.values())
    if any(n < 0 or not math.isfinite(n) for n in norms):
        return float("inf")
    return math.sqrt(sum(n * n for n in norms))


@contextlib.contextmanager
def _global_norm_in(engine, norm: float, clip: float) -> Iterator[None]:
    opt = engine.optimizer
    device = next(engine.module.parameters()).device
    if is_zero12(opt):
        name, value = "scaled_global_norm", (lambda norm_type=2: torch.tensor(norm, dtype=torch.float32, device=device))
    elif _is_zero3(opt):
        name, value = "_get_norm_groups", (lambda: [torch.tensor(norm, dtype=torch.float32, device=device)])
    else:
        yield
        return
    saved_clip = opt.clip_grad
    opt.clip_grad = clip
    setattr(opt, name, value)  # instance attribute shadows the method for this one step
    try:
        yield
    finally:
        delattr(opt, name)
        opt.clip_grad = saved_clip


@contextlib.contextmanager
def instance_attrs(obj, **attrs) -> Iterator[None]:
    """Set instance attributes for one call; restore what the instance had (a torch LR
    scheduler, for one, wraps `optimizer.step` as an instance attribute)."""
    missing = object()
    saved = {name: obj.__dict__.get(name, missing) for name in attrs}
    for name, value in attrs.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, value)


def overflow_forced(engine) -> contextlib.AbstractContextManager:
    """Makes the next `engine.step()` take DeepSpeed's overflow path, as DeepSpeed itself does
    when it finds non-finite gradients (`DeepSpeedEngine._take_model_step`)."""
    opt = engine.optimizer
    if is_zero12(opt):
        # its step() runs check_overflow only when check_grad_overflow is set (bf16 may turn it off)
        def check_overflow(partition_gradients=True):
            opt.overflow = True
        return instance_attrs(opt, check_grad_overflow=True, check_overflow=check_overflow)
    if _is_zero3(opt):
        # its step() flags overflow on an invalid norm, whatever the dtype
        return _global_norm_in(engine, float("inf"), 0.0)
    # a torch optimizer (ZeRO 0, fp32): no step, and the `overflow` flag the engine reads
    return instance_attrs(opt, step=lambda closure=None: None, overflow=True)


def step_with_global_norm(engine, norm: float, clip: float) -> bool:
    """`engine.step()` at the accumulation boundary, clipping by the all-stage `norm`.

    A norm that is not finite skips the step (see the module docstring). Returns whether the
    engine applied the step, as DeepSpeed counted it.
    """
    opt = engine.optimizer
    skipped_before = engine.skipped_steps
    if not math.isfinite(norm):
        with overflow_forced(engine):
            engine.step()
        return engine.skipped_steps == skipped_before
    if not (is_zero12(opt) or _is_zero3(opt)) and clip > 0 and math.isfinite(norm):
        coef = clip / (norm + 1e-6)
        if coef < 1.0:
            for p in engine.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
    with _global_norm_in(engine, norm, clip):
        engine.step()
    return engine.skipped_steps == skipped_before
