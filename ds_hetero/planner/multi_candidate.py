"""A layout per encoder plus the language's, and every such configuration the engine accepts.

A `MultiCandidate` gives each encoder stage its own `StageChoice` (tp, dp, ranks) and says, per
encoder, whether it runs on the language's ranks (colocated with it) or on ranks of its own:

    colocated       every stage on every rank
    disaggregated   every encoder on its own block of ranks, the language on the last block
    mixed           some encoders on the language's ranks, the others on blocks of their own

Candidates are generated from divisors (each stage's tp x dp = its ranks; the language's tp x
cp x dp as for one encoder: enumerate.py's `_stage_layouts`) and rank splits, and each is then
checked by `check_candidate`, the checks `ds-hetero validate` and `initialize` run: whether a
placement, a tp or a batch split is valid is decided there only. Every encoder runs one pass
per language micro-batch (fewer encoder passes per step are not searched here).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ..config import SECTION
from ..errors import HeteroConfigError
from .candidate import StageChoice
from .enumerate import SearchSpace, _stage_layouts, divisors
from .frozen import carry_freeze
from .validity import check_candidate


@dataclass(frozen=True)
class MultiCandidate:
    placement: str
    encoders: tuple[tuple[str, StageChoice], ...]
    language: StageChoice
    micro_batches: int

    # what report.py / search.py ask of a candidate
    encoder_passes = None
    pp_layers = None
    global_batch = None
    modelled_features = False
    megatron = False

    @property
    def passes(self) -> int:
        return self.micro_batches

    @property
    def disaggregated(self) -> bool:
        return self.placement == "disaggregated"

    def apart(self, name: str) -> bool:
        """Whether encoder `name` runs on ranks of its own (not the language's)."""
        return bool(dict(self.encoders)[name].ranks) and dict(self.encoders)[name].ranks != self.language.ranks

    @property
    def homogeneous(self) -> bool:
        """Every encoder in the language's layout: colocated, the language's tp, its cp x dp as dp."""
        lang = self.language
        return self.placement == "colocated" and all(
            e.tp == lang.tp and e.dp == lang.dp * lang.cp for _, e in self.encoders)

    def label(self) -> str:
        def one(name, s):
            where = f"@{s.ranks[0]}-{s.ranks[-1]}" if s.ranks and self.placement != "colocated" else ""
            return f"{name} {s.label()}{where}"

        parts = [one(name, s) for name, s in self.encoders] + [one("L", self.language)]
        return ", ".join(parts) + f" mb{self.micro_batches}"

    def section(self) -> dict[str, Any]:
        stages: dict[str, Any] = {}
        for name, s in (*self.encoders, ("language", self.language)):
            st: dict[str, Any] = {"tp": s.tp, "dp": s.dp}
            if name == "language":
                st["cp"] = s.cp
                if s.sequence_parallel:
                    st["sequence_parallel"] = True
            if self.placement != "colocated":
                st["ranks"] = list(s.ranks)
            stages[name] = st
        return {"placement": self.placement, "micro_batches": self.micro_batches, "stages": stages}

    def ds_config(self, base: Mapping[str, Any], extra_section: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`base` with this candidate as its hetero_parallel section (per-stage batch keys dropped)."""
        cfg = copy.deepcopy(dict(base))
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            cfg.pop(key, None)
        cfg[SECTION] = carry_freeze(self.section(), base) | dict(extra_section or {})
        return cfg


def _splits(space: SearchSpace, names: tuple[str, ...]) -> Iterator[tuple[str, int, dict[str, tuple[int, ...]]]]:
    """(placement, language ranks, {apart encoder: its ranks}): the language's block first when
    some encoders share it, every apart encoder on a consecutive block after it."""
    n = space.world_size
    if "colocated" in space.placements:
        yield "colocated", n, {}
    step = space.node_size if space.node_size and n > space.node_size and n % space.node_size == 0 else 1
    for k in range(1, len(names) + 1):
        for apart in itertools.combinations(names, k):
            placement = "disaggregated" if k == len(names) else "mixed"
            if placement not in space.placements:
                continue
            # sizes of the apart blocks and the language's, each a positive multiple of `step`
            for sizes in itertools.product(range(step, n, step), repeat=k):
                nl = n - sum(sizes)
                if nl < step or nl % step:
                    continue
                blocks, start = {}, nl
                for name, size in zip(apart, sizes):
                    blocks[name] = tuple(range(start, start + size))
                    start += size
                yield placement, nl, blocks


def _accepts(base, adapter, names, language: StageChoice, client_opt: bool) -> bool:
    probe = MultiCandidate("colocated", tuple((n, StageChoice(1, 4)) for n in names), language, 1)
    try:
        check_candidate(probe.ds_config(dict(base, train_batch_size=8)), 4, adapter, client_opt)
        return True
    except HeteroConfigError:
        return False


def sequence_sharding(base, adapter, names, client_opt: bool = False) -> tuple[bool, bool]:
    """(cp > 1 accepted, sequence parallelism accepted) by today's validation, on a 4-rank probe
    (as enumerate.py's, with every encoder stage of the model)."""
    return (_accepts(base, adapter, names, StageChoice(tp=1, cp=2, dp=2), client_opt),
            _accepts(base, adapter, names, StageChoice(tp=2, dp=2, sequence_parallel=True), client_opt))


def enumerate_multi(space: SearchSpace, base: Mapping[str, Any], adapter, names: tuple[str, ...],
                    has_client_optimizer: bool = False) -> tuple[list[MultiCandidate], dict]:
    """(valid candidates, stats): every candidate passed check_candidate; stats count the rejections."""
    cp_ok, sp_ok = sequence_sharding(base, adapter, names, has_client_optimizer)
    mbs = [m for m in (space.micro_batches or divisors(space.global_batch)) if m <= space.max_micro_batches]
    out: list[MultiCandidate] = []
    stats = {"generated": 0, "rejected": 0, "cp": cp_ok, "sequence_parallel": sp_ok, "reasons": {}}
    cache: dict = {}
    for placement, nl, blocks in _splits(space, names):
        l_ranks = () if placement == "colocated" else tuple(range(nl))
        per_encoder = []
        for name in names:
            ranks = blocks.get(name, l_ranks)
            size = len(ranks) or nl
            per_encoder.append([(name, StageChoice(s.tp, s.dp, ranks=ranks))
                                for s in _stage_layouts(size, space.max_tp, False, cp_ok, sp_ok)])
        for lang in _stage_layouts(nl, space.max_tp, True, cp_ok, sp_ok):
            lang = StageChoice(lang.tp, lang.dp, lang.cp, lang.sequence_parallel, l_ranks)
            for encoders in itertools.product(*per_encoder):
                for m in mbs:
                    cand = MultiCandidate(placement, tuple(encoders), lang, m)
                    stats["generated"] += 1
                    try:
                        check_candidate(cand.ds_config(base), space.world_size, adapter, has_client_optimizer,
                                        cache)
                        out.append(cand)
                    except HeteroConfigError as exc:
                        stats["rejected"] += 1
                        stats["reasons"][exc.field] = stats["reasons"].get(exc.field, 0) + 1
    return out, stats
