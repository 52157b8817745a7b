"""Which samples of the global batch a stage's dp rank handles in each micro-batch.

Every rank holds the same list of samples for one optimizer step (the global batch). The
batch is cut into `micro_batches` consecutive micro-batches; inside a micro-batch, each stage
gives its dp rank d the d-th contiguous share. Stages with different dp therefore cut the
same micro-batch differently, which is what the boundary reconciles.
"""

from __future__ import annotations

from ..config import HeteroConfig


def dp_share(micro_batch: int, micro_batch_size: int, dp: int, dp_rank: int) -> range:
    """Batch positions dp rank `dp_rank` of `dp` handles in `micro_batch` (of `micro_batch_size`
    samples, all dp ranks together): the d-th contiguous share. The one place this cut is made."""
    per_rank = micro_batch_size // dp
    start = micro_batch * micro_batch_size + dp_rank * per_rank
    return range(start, start + per_rank)


def micro_batch_samples(cfg: HeteroConfig, micro_batch: int, stage: str | None = None) -> range:
    """Global-batch indices of the samples in one micro-batch (of `stage`; default: the language's)."""
    size = cfg.global_batch_size // (cfg.micro_batches if stage is None else cfg.micro_batches_of(stage))
    return dp_share(micro_batch, size, 1, 0)


def stage_samples(cfg: HeteroConfig, stage: str, dp_rank: int, micro_batch: int) -> range:
    """Global-batch indices that dp rank `dp_rank` of `stage` handles in `micro_batch`."""
    size = cfg.global_batch_size // cfg.micro_batches_of(stage)
    return dp_share(micro_batch, size, cfg.stages[stage].dp, dp_rank)
