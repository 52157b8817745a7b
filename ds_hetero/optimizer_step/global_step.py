"""The optimizer step of all stages as of one model: one gradient norm over every stage, one clip.

Each stage's gradient norm is identical on its ranks (clipping.stage_norm); the stage's first
rank alone contributes it (with a pipelined language stage, the first rank of every pipeline
stage contributes that stage's layers: their squares add up to the stage's norm), so one all-reduce over the boundary group gives every rank the
model's norm. The same all-reduce carries the step's loss sum and label count, which is how a
rank that holds no language stage (disaggregated placement) learns the loss.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import clipping
from ..stages.stage_set import StageSet


def check_clippable(stages: StageSet) -> None:
    """Every trained stage's optimizer wrapper is one whose clipping can span all stages (else a
    HeteroConfigError naming zero_optimization.stage): checked once, when the engine is built."""
    for stage in stages.training:
        clipping.check_supported(stage.engine, stage.name)


def stage_norms(stages: StageSet) -> dict[str, torch.Tensor]:
    """The gradient norm of every stage this rank trains (identical on all ranks of the stage, a
    0-dim tensor on the device: no host read); a frozen stage has no gradient and adds nothing."""
    norms = {}
    for stage in stages.training:
        with stage.context():
            norms[stage.name] = clipping.stage_norm(stage.engine, stage.groups.tp)
    return norms


def combine_norms_and_loss(stages: StageSet, norms: dict[str, torch.Tensor], loss_sum: float | torch.Tensor,
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
        if stage.name in norms and stages.rank == stage.norm_rank:
            norm = norms[stage.name].to(vec.device, torch.float64)  # exact (from fp32 or fp64)
            # DeepSpeed reports an invalid norm as -1: carry it as inf so every stage skips; on
            # the device, as the host did it (the square in float64), without reading the norm
            vec[i] = torch.where((norm >= 0) & torch.isfinite(norm), norm * norm, float("inf"))
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


def step_all(stages: StageSet, grad_norm: float, clip: float) -> list[bool]:
    """Every trained stage's last (clipped) step with the model's norm; whether each applied."""
    applied = []
    for stage in stages.training:
        with stage.context():
            applied.append(clipping.step_with_global_norm(stage.engine, grad_norm, clip))
    return applied
