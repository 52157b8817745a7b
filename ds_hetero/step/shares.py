"""Which samples of the global batch a stage's dp rank handles in each micro-batch.

Every rank holds the same list of samples for one optimizer step (the global batch). The
batch is cut into `micro_batches` consecutive micro-batches; inside a micro-batch, each stage
gives its dp rank d the d-th contiguous share. Stages with different dp therefore cut the
same micro-batch differently, which is what the boundary reconciles.
"""

from __future__ import annotations

from ..config import HeteroConfig


def micro_batch_samples(cfg: HeteroConfig, micro_batch: int, stage: str | None = None) -> range:
    """Global-batch indices of the samples in one micro-batch (of `stage`; default: the language's)."""
    size = cfg.global_batch_size // (cfg.micro_batches if stage is None else cfg.micro_batches_of(stage))
    return range(micro_batch * size, (micro_batch + 1) * size)


def stage_samples(cfg: HeteroConfig, stage: str, dp_rank: int, micro_batch: int) -> range:
    """Global-batch indices that dp rank `dp_rank` of `stage` handles in `micro_batch`."""
    per_rank = cfg.micro_batch_size(stage)
    start = micro_batch_samples(cfg, micro_batch, stage).start + dp_rank * per_rank
    return range(start, start + per_rank)
