"""Every configuration ds_hetero would accept for a model, a world size and a global batch.

Candidates are generated from the divisors of the sizes (tp x cp x dp = a stage's ranks,
micro-batches dividing the global batch) and each is then checked by `check_candidate`, the
same checks `ds-hetero validate` and `initialize` run, so a rule lives in one place only.

Each colocated candidate also comes with every number of encoder passes dividing its
micro-batches (`stages.vision.micro_batches`); with a sharded language sequence only when a
probe says the validation accepts that. Disaggregated splits may round the global batch down to
one both stages' dp x micro-batches divide (`batch_slack`; ranked by tokens/s, not step time).

Context parallelism and sequence parallelism are behind one switch, `sequence_sharding`, that
is derived from what the validation accepts: a probe candidate with language cp 2 (resp.
sequence parallelism) is validated, and only if it passes are such candidates generated. When
the engine learns them (issue 10), they appear in the search with no change here.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def _accepts(base: Mapping[str, Any], world: int, adapter, language: StageChoice, vision: StageChoice,
             client_opt: bool) -> bool:
    probe = Candidate("colocated", vision, language, 1)
    try:
        check_candidate(probe.ds_config(base), world, adapter, client_opt)
        return True
    except HeteroConfigError:
        return False


def sequence_sharding(base: Mapping[str, Any], adapter, client_opt: bool = False, world: int = 4) -> tuple[bool, bool]:
    """(cp > 1 accepted, sequence parallelism accepted) by today's validation, on a probe of 4 ranks.

    The probe uses sizes the tiny and real models both divide (2); a model that 2 does not
    divide gets False, which only narrows the search.
    """
    b = dict(base, train_batch_size=max(4, int(base.get("train_batch_size", 4))) // 4 * 4)
    cp = _accepts(b, world, adapter, StageChoice(tp=1, cp=2, dp=2), StageChoice(tp=1, dp=4), client_opt)
    sp = _accepts(b, world, adapter, StageChoice(tp=2, dp=2, sequence_parallel=True), StageChoice(tp=1, dp=4),
                  client_opt)
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


def _passes(cand: Candidate, space: SearchSpace, sharded_ok: bool) -> Iterator[Candidate]:
    """The candidate with each number of encoder passes dividing its micro-batches (colocated: the
    disaggregated 1F1B pairs passes with micro-batches one for one)."""
    yield cand
    lang = cand.language
    if cand.disaggregated or (not sharded_ok and (lang.cp > 1 or lang.sequence_parallel)):
        return
    for p in divisors(cand.micro_batches)[:-1]:
        yield Candidate(cand.placement, cand.vision, lang, cand.micro_batches, p, global_batch=cand.global_batch)


def _batch(space: SearchSpace, vis: StageChoice, lang: StageChoice, m: int) -> int | None:
    """None: the workload's batch; else the largest batch both stages' dp x m divide, within the slack."""
    from math import lcm

    step = lcm(vis.dp * m, lang.dp * m)
    b = space.global_batch - space.global_batch % step
    if b == space.global_batch or b < space.global_batch * (1 - space.batch_slack) or b == 0:
        return None
    return b


def stage_layouts(size: int, max_tp: int, language: bool, cp_ok: bool, sp_ok: bool) -> Iterator[StageChoice]:
    for tp in divisors(size):
        if tp > max_tp:
            continue
        for cp in (divisors(size // tp) if language and cp_ok else [1]):
            dp = size // (tp * cp)
            yield StageChoice(tp=tp, cp=cp, dp=dp)
            if language and sp_ok and tp > 1:
                yield StageChoice(tp=tp, cp=cp, dp=dp, sequence_parallel=True)


def _rank_splits(space: SearchSpace) -> Iterator[tuple[str, int, int]]:
    n = space.world_size
    if "colocated" in space.placements:
        yield "colocated", n, n
    if "disaggregated" in space.placements:
        # A stage that shares a node with the other stage splits the node's NVLink domain; on more
        # than one node only whole-node splits are searched (a placement policy, not a validity rule).
        step = space.node_size if space.node_size and n > space.node_size and n % space.node_size == 0 else 1
        units = n // step
        counts = range(1, units) if units <= MAX_SPLITS else _split_grid(units)
        for v in counts:
            yield "disaggregated", v * step, n - v * step


MAX_SPLITS = 32  # more whole-node splits than this: a geometric grid of them (planning time at 1024 GPUs)


def _split_grid(units: int) -> list[int]:
    """Split points 2^k and 3 x 2^k units from either end (the encoder's share and the language's):
    within a factor 1.5 of any split, a search policy for speed, not a validity rule."""
    grid = {c for k in range(units.bit_length()) for c in (2 ** k, 3 * 2 ** k) if c < units}
    return sorted(grid | {units - c for c in grid})


def enumerate_candidates(space: SearchSpace, base: Mapping[str, Any], adapter, has_client_optimizer: bool = False
                         ) -> tuple[list[Candidate], dict]:
    """(valid candidates, stats): every candidate passed check_candidate; stats count the rejections."""
    cp_ok, sp_ok = sequence_sharding(base, adapter, has_client_optimizer)
    passes_sharded = encoder_passes_with_sharding(base, adapter, has_client_optimizer)
    mbs = [m for m in (space.micro_batches or divisors(space.global_batch)) if m <= space.max_micro_batches]
    out: list[Candidate] = []
    stats = {"generated": 0, "rejected": 0, "cp": cp_ok, "sequence_parallel": sp_ok, "reasons": {}}
    layout_cache: dict = {}
    for placement, nv, nl in _rank_splits(space):
        v_ranks = tuple(range(nv)) if placement == "disaggregated" else ()
        l_ranks = tuple(range(nv, nv + nl)) if placement == "disaggregated" else ()
        for vis in stage_layouts(nv, space.max_tp, False, cp_ok, sp_ok):
            vis = StageChoice(vis.tp, vis.dp, ranks=v_ranks)
            for lang in stage_layouts(nl, space.max_tp, True, cp_ok, sp_ok):
                lang = StageChoice(lang.tp, lang.dp, lang.cp, lang.sequence_parallel, l_ranks)
                for m in mbs:
                    first = Candidate(placement, vis, lang, m)
                    if placement == "disaggregated" and space.batch_slack:
                        b = _batch(space, vis, lang, m)
                        if b is not None:
                            first = Candidate(placement, vis, lang, m, global_batch=b)
                    for cand in _passes(first, space, passes_sharded):
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
