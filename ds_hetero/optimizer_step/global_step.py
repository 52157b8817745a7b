"""The optimizer step of all stages as of one model: one gradient norm over every stage, one clip.

A ZeRO 1/2 stage whose gradient elements are each counted by exactly one of its ranks gives
each rank's share of its squared norm (norm_shares.py), and every rank adds its share. Any other
stage's norm is identical on its ranks (clipping.stage_norm, DeepSpeed's own norm with its
all-reduces); the stage's first rank alone contributes it (with a pipelined language stage, the
first rank of every pipeline stage contributes that stage's layers: their squares add up to the
stage's norm). Either way one all-reduce over the boundary group gives every rank the model's
norm. The same all-reduce carries the step's loss sum and label count, which is how a rank that
holds no language stage (disaggregated placement) learns the loss.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import clipping, idle_stages, norm_shares
from ..stages.stage_set import StageSet


class StageNorm(NamedTuple):
    """A stage's gradient norm on this rank: the norm itself (identical on the stage's ranks), or
    (`share`) this rank's share of its square, which every rank of the stage adds."""

    value: torch.Tensor
    share: bool


def check_clippable(stages: StageSet) -> None:
    """Every trained stage's optimizer wrapper is one whose clipping can span all stages (else a
    HeteroConfigError naming zero_optimization.stage): checked once, when the engine is built."""
    for stage in stages.training:
        clipping.check_supported(stage.engine, stage.name)


def stage_norms(stages: StageSet, sharing: frozenset[str] = frozenset()) -> dict[str, StageNorm]:
    """The gradient norm (or, for the stages in `sharing` (norm_shares.sharing_stages), this rank's
    share of its square) of every stage this rank trains: a 0-dim tensor on the device, no host
    read; a frozen stage has no gradient and adds nothing. Stages sharing one engine
    (stages/shared_engine.py) have one norm, under the name of the stage that owns the engine."""
    norms = {}
    for stage in stages.stepping:
        with stage.context():
            if stage.name in sharing and norm_shares.shares_this_step(stage.engine.optimizer):
                norms[stage.name] = StageNorm(norm_shares.norm_sq_share(stage.engine.optimizer), True)
            else:
                norms[stage.name] = StageNorm(clipping.stage_norm(stage.engine, stage.groups.tp), False)
    return norms


def combine_norms_and_loss(stages: StageSet, norms: dict[str, StageNorm], loss_sum: float | torch.Tensor,
                           n_labels: int, aux_sum: float | torch.Tensor = 0.0) -> tuple[float, float, int, float]:
    """(all-stage gradient norm, global loss sum, global label count, global aux-loss sum) on every
    rank, in one all-reduce.

    The local loss sums come from tp rank 0 of every cp shard of every language dp replica
    (with a pipeline only the last pipeline stage has a loss: the others pass 0), the label
    count from the language stage's first rank. `aux_sum`: a mixture-of-experts language stage's
    shares of its micro-batches' load-balancing losses, from the same ranks (0 without one).
    """
    all_stages = list(stages)
    vec = torch.zeros(len(all_stages) + 3, dtype=torch.float64, device=stages.device)
    for i, stage in enumerate(all_stages):
        if stage.name not in norms:
            continue
        value, share = norms[stage.name]
        value = value.to(vec.device, torch.float64)  # exact (from fp32 or fp64)
        if share:  # every rank of the stage adds its share of the square; a non-finite one makes inf
            vec[i] = torch.where(torch.isfinite(value), value, float("inf"))
        elif stages.rank == stage.norm_rank:
            # DeepSpeed reports an invalid norm as -1: carry it as inf so every stage skips; on
            # the device, as the host did it (the square in float64), without reading the norm
            vec[i] = torch.where((value >= 0) & torch.isfinite(value), value * value, float("inf"))
    language = stages.language
    if language.held and language.coord.tp == 0:  # cp ranks hold the loss sums of their sequence shards
        vec[-3] = loss_sum
        vec[-2] = aux_sum
    if stages.rank == language.first_rank:
        vec[-1] = n_labels
    dist.all_reduce(vec, group=stages.boundary_group)
    # one host read of the four (the norms summed on the device as before)
    norm_sq, loss, aux, labels = torch.cat([vec[: len(all_stages)].sum().reshape(1), vec[-3:]]).tolist()
    return math.sqrt(norm_sq), loss, int(labels), aux


def step_all(stages: StageSet, grad_norm: float, clip: float, idle: frozenset[str] = frozenset()) -> list[bool]:
    """Every trained engine's last (clipped) step with the model's norm; whether each applied.
    `idle`: the stages with no work this step (StepPlan.idle_encoders), whose parameters are left
    as one process leaves parameters without a gradient (idle_stages.py)."""
    applied = []
    for stage in stages.stepping:
        # the stages whose parameters this engine steps: its own, or every stage sharing it
        names = [s.name for s in stages.training if (s.engine_owner or s.name) == stage.name]
        held = [n for n in names if n in idle]
        with stage.context():
            if held and len(held) == len(names) and math.isfinite(grad_norm):
                idle_stages.hold_step(stage.engine)
                applied.append(True)
                continue
            params = [p for n in held for p in stages[n].module.parameters() if p.requires_grad]
            with idle_stages.without(stage.engine, params) if held else contextlib.nullcontext():
                applied.append(clipping.step_with_global_norm(stage.engine, grad_norm, clip))
    return applied
