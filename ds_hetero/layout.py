"""Stage layouts: the pure rank arithmetic of one stage (no torch.distributed here).

A stage runs on an explicit tuple of global ranks. Inside the stage the local index of a
rank orders the axes with tp varying fastest, then cp, then dp, then pp (Megatron's default
order and DeepSpeed's `PipeModelDataParallelTopology`: pp outermost):

    local = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)),    global = ranks[local]

so the first tp*cp*dp ranks of a pipelined (language) stage are its first pipeline stage, and
`chunk(k)` is pipeline stage k's own tp x cp x dp layout over its rank subset. The tp, cp, dp
and model groups are groups inside one pipeline stage; the pp groups join the ranks at the
same (tp, cp, dp) coordinate of every pipeline stage (point-to-point neighbours).

Every group of the stage is a tuple of global ranks, listed in a fixed order so that every
process enumerates them identically (group construction is collective over the world).
"""

from __future__ import annotations

from dataclasses import dataclass
import itertools
import math
from typing import NamedTuple

# The parallelism axes, once, in rank order (tp fastest, pp outermost): the layout's sizes, a rank's
# coordinate, the config keys of a stage. An axis's own code lives in its folder (tensor_parallel/, ...).
AXES = ("tp", "cp", "dp", "pp")
# Axes folded into others, not multiplying the stage's size: ep carves the experts' groups out of
# the dp x cp ranks (Megatron's "parallel folding"; expert_parallel/, docs/expert-parallel.md).
FOLDED_AXES = ("ep",)


class Coord(NamedTuple):
    """A rank's position inside one stage (pp 0 in a stage without a pipeline)."""

    tp: int
    cp: int
    dp: int
    pp: int = 0


@dataclass(frozen=True)
class StageLayout:
    """One stage's parallel layout: axis sizes and the global ranks it runs on.

    `sequence_parallel` shards the stage's activations on the sequence dim over tp between
    blocks (language stage only); it changes which boundary rows a rank needs.
    """

    name: str
    tp: int
    cp: int
    dp: int
    ranks: tuple[int, ...]
    sequence_parallel: bool = False
    pp: int = 1  # pipeline stages (the language stage only; config/parse.py refuses it elsewhere)
    # expert-parallel size (the language stage only): experts sharded over ep ranks carved out of
    # the dp x cp ranks of each (tp, pp) coordinate ("parallel folding", docs/expert-parallel.md)
    ep: int = 1

    def __post_init__(self) -> None:
        # Config validation gives users field-level messages; these asserts guard direct use.
        for axis in AXES:
            size = getattr(self, axis)
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"stage {self.name!r}: {axis} must be a positive int, got {size!r}")
        product = math.prod(getattr(self, axis) for axis in AXES)
        if product != len(self.ranks):
            shown = [axis for axis in AXES if axis != "pp" or self.pp > 1]
            raise ValueError(
                f"stage {self.name!r}: {'*'.join(shown)} = {product} but {len(self.ranks)} ranks were given"
            )
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"stage {self.name!r}: duplicate ranks in {self.ranks}")
        if not isinstance(self.ep, int) or self.ep < 1 or (self.cp * self.dp) % self.ep:
            raise ValueError(f"stage {self.name!r}: ep={self.ep!r} must be a positive divisor of cp*dp "
                             f"({self.cp * self.dp})")

    # ------------------------------------------------------------------ coordinates
    @property
    def size(self) -> int:
        return len(self.ranks)

    def contains(self, rank: int) -> bool:
        return rank in self.ranks

    def coord(self, rank: int) -> Coord:
        """Coordinate of a global rank; raises KeyError if the rank is not in this stage."""
        try:
            local = self.ranks.index(rank)
        except ValueError:
            raise KeyError(f"rank {rank} is not in stage {self.name!r} (ranks {self.ranks})") from None
        return self._coord_of(local)

    def _coord_of(self, local: int) -> Coord:
        return Coord(tp=local % self.tp, cp=(local // self.tp) % self.cp, dp=(local // (self.tp * self.cp)) % self.dp,
                     pp=local // (self.tp * self.cp * self.dp))

    def rank_at(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """Global rank at a coordinate."""
        if not (0 <= tp < self.tp and 0 <= cp < self.cp and 0 <= dp < self.dp and 0 <= pp < self.pp):
            raise IndexError(f"coordinate (tp={tp}, cp={cp}, dp={dp}, pp={pp}) outside stage {self.name!r} {self.shape}")
        return self.ranks[tp + self.tp * (cp + self.cp * (dp + self.dp * pp))]

    @property
    def shape(self) -> str:
        return (f"tp{self.tp}cp{self.cp}dp{self.dp}" + (f"pp{self.pp}" if self.pp > 1 else "")
                + (f"ep{self.ep}" if self.ep > 1 else ""))

    # ------------------------------------------------------------------ pipeline stages
    @property
    def chunk_size(self) -> int:
        """Ranks of one pipeline stage (tp x cp x dp)."""
        return self.tp * self.cp * self.dp

    def chunk(self, k: int) -> "StageLayout":
        """Pipeline stage k as a layout of its own (pp 1) over its ranks: the boundary's destination
        is `chunk(0)`, the ranks that hold the embeddings."""
        if not 0 <= k < self.pp:
            raise IndexError(f"pipeline stage {k} outside stage {self.name!r} (pp {self.pp})")
        n = self.chunk_size
        return StageLayout(self.name, self.tp, self.cp, self.dp, self.ranks[k * n:(k + 1) * n], self.sequence_parallel,
                           ep=self.ep)

    # ------------------------------------------------------------------ groups
    def _groups(self, varying: tuple[str, ...]) -> list[tuple[int, ...]]:
        """Rank tuples of the groups in which the `varying` axes change and the others are fixed.

        Groups are listed by the fixed axes in (dp, cp, tp) order; inside a group ranks follow
        the local order (tp fastest). Deterministic on every process.
        """
        sizes = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}
        fixed = [a for a in ("pp", "dp", "cp", "tp") if a not in varying]
        groups = []
        for fixed_values in itertools.product(*(range(sizes[a]) for a in fixed)):
            pinned = dict(zip(fixed, fixed_values))
            members = []
            for local in range(self.size):
                c = self._coord_of(local)
                if all(getattr(c, a) == v for a, v in pinned.items()):
                    members.append(self.ranks[local])
            groups.append(tuple(members))
        return groups

    def tp_groups(self) -> list[tuple[int, ...]]:
        return self._groups(("tp",))

    def cp_groups(self) -> list[tuple[int, ...]]:
        return self._groups(("cp",))

    def dp_groups(self) -> list[tuple[int, ...]]:
        return self._groups(("dp",))

    def dp_cp_groups(self) -> list[tuple[int, ...]]:
        """Ranks that hold the same parameter shard: gradients are reduced over dp x cp."""
        return self._groups(("cp", "dp"))

    def model_parallel_groups(self) -> list[tuple[int, ...]]:
        """Ranks that together hold one full copy of the parameters (tp x cp)."""
        return self._groups(("tp", "cp"))

    def pp_groups(self) -> list[tuple[int, ...]]:
        """Ranks at one (tp, cp, dp) coordinate of every pipeline stage, in pipeline order; none
        without a pipeline (no group of one rank is created for it)."""
        return self._groups(("pp",)) if self.pp > 1 else []

    def _folded(self, expert_parallel: bool) -> list[tuple[int, ...]]:
        """Expert groups folded into each dp x cp group (Megatron's parallel folding, ep innermost):
        the dp x cp ranks in local order (cp fastest) are cut into consecutive blocks of ep ranks;
        `expert_parallel` gives the blocks (ep groups: together they hold every expert once),
        otherwise the ranks at one position of every block (expert-data-parallel groups: they
        hold the same experts, and reduce their gradients). None with ep 1."""
        if self.ep == 1:
            return []
        out = []
        for members in self.dp_cp_groups():
            blocks = [members[i:i + self.ep] for i in range(0, len(members), self.ep)]
            out += blocks if expert_parallel else [tuple(b[j] for b in blocks) for j in range(self.ep)]
        return out

    def ep_groups(self) -> list[tuple[int, ...]]:
        return self._folded(True)

    def edp_groups(self) -> list[tuple[int, ...]]:
        return self._folded(False)

    def ep_rank(self, rank: int) -> int:
        """This rank's position in its ep group (which slice of the experts it holds)."""
        c = self.coord(rank)
        return (c.cp + self.cp * c.dp) % self.ep

    def groups_of(self, axis: str) -> list[tuple[int, ...]]:
        return {
            "ep": self.ep_groups,
            "edp": self.edp_groups,
            "pp": self.pp_groups,
            "tp": self.tp_groups,
            "cp": self.cp_groups,
            "dp": self.dp_groups,
            "dp_cp": self.dp_cp_groups,
            "model": self.model_parallel_groups,
        }[axis]()

    def group_containing(self, axis: str, rank: int) -> tuple[int, ...]:
        for group in self.groups_of(axis):
            if rank in group:
                return group
        raise KeyError(f"rank {rank} is not in stage {self.name!r}")


GROUP_KINDS = ("tp", "cp", "dp", "dp_cp", "model", "pp", "ep", "edp")

