"""A layout per encoder plus the language's, and every such configuration the engine accepts.

A `Candidate` gives each encoder stage its own `StageChoice` (tp, dp, ranks, recompute,
ZeRO stage) and says, per encoder, whether it runs on the language's ranks (colocated with it)
or on ranks of its own:

    colocated       every stage on every rank
    disaggregated   every encoder on its own block of ranks, the language on the last block
    mixed           some encoders on the language's ranks, the others on blocks of their own
    first_stage     every encoder on the ranks of the language's first pipeline stage, at the
                    language's tp and dp (Megatron's single layout, the baseline)

The language may be pipelined (pp, pp_layers) and an encoder may run fewer passes per step than
the language has micro-batches (`encoder_passes`). `view(name)` is the candidate as the
single-encoder cost model sees it: that encoder, the language (multi_predict.py prices every
encoder through it).

`enumerate_multi` generates the layouts without a pipeline or a memory feature from divisors
(each stage's tp x dp = its ranks; the language's tp x cp x dp as for one encoder:
enumerate.py's `stage_layouts`) and rank splits; multi_extended.py the others. Each is checked
by `check_candidate`, the checks `ds-hetero validate` and `initialize` run: whether a
placement, a tp, a pipeline or a batch split is valid is decided there only.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Mapping

from ..config import SECTION
from ..errors import HeteroConfigError
from .candidate import Candidate, StageChoice
from .enumerate import SearchSpace, stage_layouts, divisors
from .validity import check_candidate


def several_splits(space: SearchSpace, names: tuple[str, ...]) -> Iterator[tuple[str, int, dict[str, tuple[int, ...]]]]:
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
    probe = Candidate("colocated", tuple((n, StageChoice(1, 4)) for n in names), language, 1)
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


class StageShapes:
    """Whether the engine's checks accept a stage's sizes for the model's shapes (tp dividing heads,
    MLP width, vocabulary; cp and sequence parallelism): `check_candidate` on a colocated probe in
    which only that stage is sharded, remembered per stage and sizes. multi_extended.py skips the
    layouts a probe refuses (as modelled.py does with validity.check_shapes for one encoder); a
    refusal that names another field than the stage's own refuses nothing."""

    def __init__(self, base: Mapping[str, Any], adapter, names: tuple[str, ...]):
        self.base, self.adapter, self.names = base, adapter, names
        self.seen: dict = {}

    def encoder(self, name: str, tp: int) -> bool:
        encoders = tuple((n, StageChoice(tp, 1) if n == name else StageChoice(1, tp)) for n in self.names)
        return self._probe((name, tp), tp, Candidate("colocated", encoders, StageChoice(1, tp), 1))

    def language(self, tp: int, cp: int, sequence_parallel: bool) -> bool:
        n = tp * cp
        encoders = tuple((e, StageChoice(1, n)) for e in self.names)
        probe = Candidate("colocated", encoders, StageChoice(tp, 1, cp, sequence_parallel), 1)
        return self._probe(("language", tp, cp, sequence_parallel), n, probe)

    def _probe(self, key: tuple, world: int, probe: Candidate) -> bool:
        stage = key[0]
        if key not in self.seen:
            cfg = dict(self.base, train_batch_size=world, zero_optimization={"stage": 1})
            try:
                check_candidate(probe.ds_config(cfg), world, self.adapter, True)
                self.seen[key] = True
            except HeteroConfigError as exc:
                self.seen[key] = not exc.field.startswith(f"{SECTION}.stages.{stage}")
        return self.seen[key]


def enumerate_multi(space: SearchSpace, base: Mapping[str, Any], adapter, names: tuple[str, ...],
                    has_client_optimizer: bool = False) -> tuple[list[Candidate], dict]:
    """(valid candidates, stats): every candidate passed check_candidate; stats count the rejections."""
    cp_ok, sp_ok = sequence_sharding(base, adapter, names, has_client_optimizer)
    mbs = [m for m in (space.micro_batches or divisors(space.global_batch)) if m <= space.max_micro_batches]
    out: list[Candidate] = []
    stats = {"generated": 0, "rejected": 0, "cp": cp_ok, "sequence_parallel": sp_ok, "reasons": {}}
    cache: dict = {}
    for placement, nl, blocks in several_splits(space, names):
        l_ranks = () if placement == "colocated" else tuple(range(nl))
        per_encoder = []
        for name in names:
            ranks = blocks.get(name, l_ranks)
            size = len(ranks) or nl
            per_encoder.append([(name, StageChoice(s.tp, s.dp, ranks=ranks))
                                for s in stage_layouts(size, space.max_tp, False, cp_ok, sp_ok)])
        for lang in stage_layouts(nl, space.max_tp, True, cp_ok, sp_ok):
            lang = StageChoice(lang.tp, lang.dp, lang.cp, lang.sequence_parallel, l_ranks)
            for encoders in itertools.product(*per_encoder):
                for m in mbs:
                    cand = Candidate(placement, tuple(encoders), lang, m)
                    stats["generated"] += 1
                    try:
                        check_candidate(cand.ds_config(base), space.world_size, adapter, has_client_optimizer,
                                        cache)
                        out.append(cand)
                    except HeteroConfigError as exc:
                        stats["rejected"] += 1
                        stats["reasons"][exc.field] = stats["reasons"].get(exc.field, 0) + 1
    return out, stats
