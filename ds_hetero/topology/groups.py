"""Process groups of every stage, built once, in one order, on every rank.

`torch.distributed.new_group` is collective over the whole world: every process must call it
for every group, including groups it is not a member of, in the same order. `build_groups`
does exactly that from the validated layouts, and reuses one group object for identical rank
sets (a stage's dp group can equal the other stage's tp group, and a colocated boundary spans
the world). The result is an object passed explicitly; nothing here is module-level state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Mapping

import torch.distributed as dist

from ..layout import GROUP_KINDS, Coord, StageLayout


class GroupCache:
    """One process group per distinct sorted rank tuple, created in call order on all ranks."""

    def __init__(self, timeout: timedelta | None = None):
        self._timeout = timeout
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}

    def get(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        key = tuple(sorted(ranks))
        if key not in self._groups:
            # Backend left to torch: the default group's backend (gloo on CPU, NCCL on GPU).
            kwargs = {"timeout": self._timeout} if self._timeout is not None else {}
            self._groups[key] = dist.new_group(list(key), **kwargs)
        return self._groups[key]

    def find(self, ranks) -> dist.ProcessGroup | None:
        """The group already built for exactly these ranks, or None (never creates one: that is collective)."""
        return self._groups.get(tuple(sorted(ranks)))

    def destroy(self) -> None:
        for group in self._groups.values():
            if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)
        self._groups.clear()


@dataclass(frozen=True)
class StageGroups:
    """The process groups of one stage, as seen from this rank.

    Groups are None on a rank that is not part of the stage (disaggregated placement).
    `ranks_of[kind]` lists the members of this rank's group of that kind.
    """

    layout: StageLayout
    rank: int
    tp: dist.ProcessGroup | None
    cp: dist.ProcessGroup | None
    dp: dist.ProcessGroup | None
    dp_cp: dist.ProcessGroup | None
    model: dist.ProcessGroup | None
    stage: dist.ProcessGroup | None
    ranks_of: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    pp: dist.ProcessGroup | None = None  # this rank's pipeline neighbours (None without a pipeline)
    ep: dist.ProcessGroup | None = None  # the ranks that together hold every expert once (None with ep 1)
    edp: dist.ProcessGroup | None = None  # the ranks holding the same experts: expert gradients reduce here

    @property
    def is_member(self) -> bool:
        return self.layout.contains(self.rank)

    @property
    def coord(self) -> Coord:
        return self.layout.coord(self.rank)


@dataclass(frozen=True)
class HeteroGroups:
    """Every stage's groups, a group per (encoder, language) pair, and the boundary group.

    boundary   spans every stage's ranks (the union): the step's batch agreement, the gradient
               norm and the loss all-reduce use it
    pairs      encoder stage name -> the ranks of that encoder and of the language stage; each
               encoder's boundary exchange runs over its own pair's group, so a rank that holds
               neither stage of a pair never joins its exchanges (several encoders on different
               ranks)
    """

    stages: Mapping[str, StageGroups]
    boundary: dist.ProcessGroup
    boundary_ranks: tuple[int, ...]
    cache: GroupCache
    # encoder -> the ranks of its boundary exchanges: its own and its destination's (the language
    # stage, or with pp > 1 the language's first pipeline stage), one group each
    pairs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __getitem__(self, stage: str) -> StageGroups:
        return self.stages[stage]

    def spanning(self, ranks) -> dist.ProcessGroup:
        """The group built for exactly `ranks` (e.g. one stage pair's); KeyError if none was built."""
        group = self.cache.find(ranks)
        if group is None:
            raise KeyError(f"no process group spans exactly the ranks {tuple(sorted(ranks))}; "
                           f"build_groups builds one per stage pair {dict(self.pairs)} and the union "
                           f"{self.boundary_ranks}")
        return group

    def pair_member(self, encoder: str) -> bool:
        """Whether this rank takes part in `encoder`'s boundary exchanges."""
        return self.stages[encoder].rank in self.pairs[encoder]

    def destroy(self) -> None:
        self.cache.destroy()


def build_groups(
    layouts: Mapping[str, StageLayout], rank: int, timeout: timedelta | None = None, language: str = "language"
) -> HeteroGroups:
    """Create every group of every stage, in stage order then GROUP_KINDS order, then the union
    (boundary) group, then one group per (encoder, `language`) pair in stage order, on all ranks.

    Must be called by every rank of the world with the same `layouts` (a validated config
    guarantees that), otherwise `new_group` hangs.
    """
    cache = GroupCache(timeout)
    stages = {}
    for name, layout in layouts.items():
        mine: dict[str, dist.ProcessGroup | None] = {}
        ranks_of: dict[str, tuple[int, ...]] = {}
        for kind in GROUP_KINDS:
            for members in layout.groups_of(kind):
                group = cache.get(members)
                if rank in members:
                    mine[kind] = group
                    ranks_of[kind] = members
        stage_group = cache.get(layout.ranks)
        if layout.contains(rank):
            ranks_of["stage"] = tuple(layout.ranks)
        stages[name] = StageGroups(
            layout=layout,
            rank=rank,
            tp=mine.get("tp"),
            cp=mine.get("cp"),
            dp=mine.get("dp"),
            dp_cp=mine.get("dp_cp"),
            model=mine.get("model"),
            pp=mine.get("pp"),
            ep=mine.get("ep"),
            edp=mine.get("edp"),
            stage=stage_group if layout.contains(rank) else None,
            ranks_of=ranks_of,
        )
    boundary_ranks = tuple(sorted(set().union(*(l.ranks for l in layouts.values()))))
    boundary = cache.get(boundary_ranks)
    pairs = {}
    if language in layouts:
        lang = layouts[language]
        destination = lang.chunk(0) if lang.pp > 1 else lang  # the boundary ends at the first pipeline stage
        for name, layout in layouts.items():
            if name != language:  # colocated without pp: the pair's ranks are the union, the same group
                pairs[name] = tuple(sorted(set(layout.ranks) | set(destination.ranks)))
                cache.get(pairs[name])
    return HeteroGroups(stages=stages, boundary=boundary, boundary_ranks=boundary_ranks, cache=cache, pairs=pairs)
