"""The embedding group of a pipelined language stage (Megatron's): first and last pipeline stage.

With tied input/output embeddings and pp > 1 the input embedding sits on the first pipeline
stage and the head on the last, each rank holding its own copy of the tied weight (its tp rows
of it). For every (tp, cp, dp) coordinate of the language stage the group joins the rank of the
first pipeline stage and the rank of the last at that coordinate: the two ranks that hold the
same rows of the two copies, and whose gradients are summed after each step's backward
(stages/tied_embeddings.py). With pp 2 each pair is exactly a pp group, and the group object is
the one `build_groups` made for it.

`torch.distributed.new_group` is collective over the world, so every rank (also one that holds
no language stage, in disaggregated placement) builds every pair's group, in coordinate order,
through the same GroupCache as every other group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from .groups import GroupCache
from ..layout import StageLayout


@dataclass(frozen=True)
class EmbeddingGroup:
    """This rank's pair (first-stage rank, last-stage rank) and its group; both None on a rank
    that holds neither end of the pipeline (a middle pipeline stage, or another stage's rank)."""

    ranks: tuple[int, int] | None
    group: dist.ProcessGroup | None

    @property
    def is_member(self) -> bool:
        return self.ranks is not None


def embedding_pairs(layout: StageLayout) -> list[tuple[int, int]]:
    """(first pipeline stage's rank, last pipeline stage's rank) at every (tp, cp, dp), in rank order."""
    last = layout.pp - 1
    return [(layout.rank_at(tp, cp, dp, 0), layout.rank_at(tp, cp, dp, last))
            for dp in range(layout.dp) for cp in range(layout.cp) for tp in range(layout.tp)]


def build_embedding_group(layout: StageLayout, rank: int, cache: GroupCache) -> EmbeddingGroup:
    """Every pair's group, created on every rank in the same order; this rank's pair."""
    if layout.pp < 2:
        raise ValueError(f"stage {layout.name!r} has no pipeline (pp {layout.pp}): no embedding group")
    mine = EmbeddingGroup(None, None)
    for pair in embedding_pairs(layout):
        group = cache.get(pair)
        if rank in pair:
            mine = EmbeddingGroup(pair, group)
    return mine
