"""Every configuration ds_hetero would accept for a model, a world size and a global batch: a layout
per encoder and the language's, without a pipeline, recompute or per-stage ZeRO (modelled.py
extends them).

Candidates are generated from the divisors of the sizes (tp x cp x dp = a stage's ranks,
micro-batches dividing the global batch) over the rank splits of each placement (`rank_splits`)
and each is then checked by `check_candidate`, the same checks `ds-hetero validate` and
`initialize` run, so a rule lives in one place only.

Search policy (for speed and for stable configs, not validity): one encoder's ranks come first
in a disaggregated split (the parser's default order: written configs carry no ranks), and on
more than MAX_SPLITS whole-node splits only a grid of them is tried; with several encoders the
language's block comes first and every apart encoder follows on a block of its own, every
combination of block sizes. With one encoder each colocated candidate also comes with every
number of encoder passes dividing its micro-batches (`stages.vision.micro_batches`), with a
sharded language sequence only when a probe says the validation accepts that; several encoders'
fewer passes are searched with the extended candidates (modelled.py). Apart encoders may round
the global batch down to one every stage's dp x micro-batches divide (`batch_slack`; ranked by
tokens/s, not step time).

Context parallelism and sequence parallelism are behind one switch, `sequence_sharding`, that
is derived from what the validation accepts: a probe candidate with language cp 2 (resp.
sequence parallelism) is validated, and only if it passes are such candidates generated. When
the engine learns them (issue 10), they appear in the search with no change here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from math import lcm
from typing import Any, Iterator, Mapping

from ..errors import HeteroConfigError
from .candidate import Candidate, StageChoice
from .validity import check_candidate


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    world_size: int
    global_batch: int
    max_tp: int = 8
    placements: tuple[str, ...] = ("colocated", "disaggregated")
    micro_batches: tuple[int, ...] | None = None  # None: every divisor of the global batch
    max_micro_batches: int = 64
    node_size: int = 0  # disaggregated splits on whole nodes when the world spans several (0: any split)
    batch_slack: float = 0.0  # a disaggregated split may round the global batch down by this fraction
    experts: int = 0  # a MoE language model's experts per layer: ep is searched (expert_degrees)


def _accepts(base: Mapping[str, Any], adapter, names: tuple[str, ...], language: StageChoice, client_opt: bool
             ) -> bool:
    probe = Candidate("colocated", tuple((n, StageChoice(tp=1, dp=4)) for n in names), language, 1)
    try:
        check_candidate(probe.ds_config(base), 4, adapter, client_opt)
        return True
    except HeteroConfigError:
        return False


def sequence_sharding(base: Mapping[str, Any], adapter, client_opt: bool = False, names: tuple[str, ...] = ("vision",)
                      ) -> tuple[bool, bool]:
    """(cp > 1 accepted, sequence parallelism accepted) by today's validation, on a probe of 4 ranks
    with every encoder stage of the model.

    The probe uses sizes the tiny and real models both divide (2); a model that 2 does not
    divide gets False, which only narrows the search.
    """
    b = dict(base, train_batch_size=max(4, int(base.get("train_batch_size", 4))) // 4 * 4)
    cp = _accepts(b, adapter, names, StageChoice(tp=1, cp=2, dp=2), client_opt)
    sp = _accepts(b, adapter, names, StageChoice(tp=2, dp=2, sequence_parallel=True), client_opt)
    return cp, sp


def encoder_passes_with_sharding(base: Mapping[str, Any], adapter, client_opt: bool = False) -> bool:
    """Whether today's validation accepts fewer encoder passes than language micro-batches with a
    sharded language sequence (a probe on 4 ranks, as `sequence_sharding`)."""
    b = dict(base, train_batch_size=8)
    probe = Candidate("colocated", StageChoice(tp=1, dp=4), StageChoice(tp=1, cp=2, dp=2), 2, encoder_passes=1)
    try:
        check_candidate(probe.ds_config(b), 4, adapter, client_opt)
        return True
    except HeteroConfigError:
        return False


def _passes(cand: Candidate, sharded_ok: bool) -> Iterator[Candidate]:
    """The candidate, then (one encoder, colocated: the disaggregated 1F1B pairs passes with
    micro-batches one for one) with each number of encoder passes dividing its micro-batches."""
    yield cand
    lang = cand.language
    if len(cand.encoders) > 1 or cand.disaggregated or (not sharded_ok and (lang.cp > 1 or lang.sequence_parallel)):
        return
    for p in divisors(cand.micro_batches)[:-1]:
        yield Candidate(cand.placement, cand.encoders, lang, cand.micro_batches, p, global_batch=cand.global_batch)


def _batch(space: SearchSpace, stages: list[StageChoice], m: int) -> int | None:
    """None: the workload's batch; else the largest batch every stage's dp x m divides, within the slack."""
    step = lcm(*(s.dp * m for s in stages))
    b = space.global_batch - space.global_batch % step
    if b == space.global_batch or b < space.global_batch * (1 - space.batch_slack) or b == 0:
        return None
    return b


def expert_degrees(experts: int, folded: int) -> list[int]:
    """The ep sizes of a language layout with `folded` = cp x dp ranks: 1, and for a MoE model every
    divisor of both the experts and cp x dp (the engine's rule, config/parse.py and
    expert_parallel/checks.py; the engine's checks still decide every candidate)."""
    return [e for e in divisors(folded) if experts % e == 0] if experts else [1]


def stage_layouts(size: int, max_tp: int, language: bool, cp_ok: bool, sp_ok: bool, experts: int = 0
                  ) -> Iterator[StageChoice]:
    for tp in divisors(size):
        if tp > max_tp:
            continue
        for cp in (divisors(size // tp) if language and cp_ok else [1]):
            dp = size // (tp * cp)
            for ep in (expert_degrees(experts, cp * dp) if language else [1]):
                yield StageChoice(tp=tp, cp=cp, dp=dp, ep=ep)
                if language and sp_ok and tp > 1:
                    yield StageChoice(tp=tp, cp=cp, dp=dp, sequence_parallel=True, ep=ep)


def rank_splits(space: SearchSpace, names: tuple[str, ...]
                ) -> Iterator[tuple[str, tuple[int, ...], dict[str, tuple[int, ...]]]]:
    """(placement, the language's ranks (() colocated), {apart encoder: its ranks})."""
    n = space.world_size
    if "colocated" in space.placements:
        yield "colocated", (), {}
    # A stage that shares a node with another splits the node's NVLink domain; on more than one
    # node only whole-node splits are searched (a placement policy, not a validity rule).
    step = space.node_size if space.node_size and n > space.node_size and n % space.node_size == 0 else 1
    if len(names) == 1:
        if "disaggregated" in space.placements:
            units = n // step
            for v in (range(1, units) if units <= MAX_SPLITS else split_grid(units)):
                yield "disaggregated", tuple(range(v * step, n)), {names[0]: tuple(range(v * step))}
        return
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
                yield placement, tuple(range(nl)), blocks


MAX_SPLITS = 32  # more whole-node splits than this: a geometric grid of them (planning time at 1024 GPUs)


def split_grid(units: int) -> list[int]:
    """Split points 2^k and 3 x 2^k units from either end (the encoder's share and the language's):
    within a factor 1.5 of any split, a search policy for speed, not a validity rule."""
    grid = {c for k in range(units.bit_length()) for c in (2 ** k, 3 * 2 ** k) if c < units}
    return sorted(grid | {units - c for c in grid})


def enumerate_candidates(space: SearchSpace, base: Mapping[str, Any], adapter, has_client_optimizer: bool = False,
                         names: tuple[str, ...] = ("vision",)) -> tuple[list[Candidate], dict]:
    """(valid candidates, stats): every candidate passed check_candidate; stats count the rejections.
    `names`: the model's encoder stages."""
    cp_ok, sp_ok = sequence_sharding(base, adapter, has_client_optimizer, names)
    passes_sharded = len(names) == 1 and encoder_passes_with_sharding(base, adapter, has_client_optimizer)
    mbs = [m for m in (space.micro_batches or divisors(space.global_batch)) if m <= space.max_micro_batches]
    out: list[Candidate] = []
    stats = {"generated": 0, "rejected": 0, "cp": cp_ok, "sequence_parallel": sp_ok, "reasons": {}}
    layout_cache: dict = {}
    for placement, l_ranks, blocks in rank_splits(space, names):
        nl = len(l_ranks) or space.world_size
        per_stage = []
        for name in names:
            ranks = blocks.get(name, l_ranks)
            per_stage.append([(name, StageChoice(s.tp, s.dp, ranks=ranks))
                              for s in stage_layouts(len(ranks) or nl, space.max_tp, False, cp_ok, sp_ok)])
        langs = [StageChoice(s.tp, s.dp, s.cp, s.sequence_parallel, l_ranks, ep=s.ep)
                 for s in stage_layouts(nl, space.max_tp, True, cp_ok, sp_ok, space.experts)]
        # one encoder: its layout outer, the language's inner; several: the language's outer
        combos = (((e,), lang) for e, lang in itertools.product(per_stage[0], langs)) if len(names) == 1 else \
            ((encoders, lang) for lang in langs for encoders in itertools.product(*per_stage))
        for encoders, lang in combos:
            for m in mbs:
                first = Candidate(placement, tuple(encoders), lang, m)
                if placement != "colocated" and space.batch_slack:
                    b = _batch(space, [e for _, e in encoders] + [lang], m)
                    if b is not None:
                        first = Candidate(placement, tuple(encoders), lang, m, global_batch=b)
                for cand in _passes(first, passes_sharded):
                    stats["generated"] += 1
                    reason = _check(cand, space, base, adapter, layout_cache, has_client_optimizer)
                    if reason is None:
                        out.append(cand)
                    else:
                        stats["rejected"] += 1
                        stats["reasons"][reason] = stats["reasons"].get(reason, 0) + 1
    return out, stats


def _check(cand: Candidate, space: SearchSpace, base, adapter, layout_cache: dict, client_opt: bool) -> str | None:
    """None if valid, else the field the validation named."""
    try:
        check_candidate(cand.ds_config(base), space.world_size, adapter, client_opt, layout_cache)
    except HeteroConfigError as exc:
        return exc.field
    return None
