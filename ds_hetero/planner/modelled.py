"""The extended candidates' generators: a language pipeline, first_stage (with the Megatron baseline),
recompute, per-stage ZeRO. The candidates below are one encoder's; their language layouts,
micro-batch policy, features and first-stage cuts are every model's (extended.py searches them).

Megatron's single layout (placement first_stage): one (tp, cp, pp, dp) for the whole model (and
for a MoE model its expert parallelism, folded out of the language's cp x dp as Megatron's
parallel folding does: the encoder's layout does not change with it); the
encoder at the language's tp on the first pipeline stage's ranks, replicated over cp (every cp
rank encodes the same images), with the language's dp, once per micro-batch; sequence
parallelism on or off, full recompute on or off, and the first stage's decoder layers tuned
(`tune_cut`: the even split and every smaller first stage, the rest split evenly).

Heterogeneous candidates: the encoder colocated on every rank in its own (tp, dp), language
(tp, cp, pp, dp) with pp > 1, or pp = 1 with recompute or a language ZeRO stage other than the
encoder's (ZeRO 3 for the LLM, the config's for the encoder), each with every number of encoder
passes dividing the language micro-batches, encoder recompute on or off; and the encoder on its
own ranks (disaggregated) with a language pipeline or recompute.

Validity: the model's shapes are checked here by the engine's checks (`validity.check_shapes`: tp
dividing heads, kv heads, MLP width, vocabulary, for these tp / cp sizes); a candidate whose shapes
pass is priced, and it is runnable exactly when the engine's checks accept its whole config
(extended.py, verdicts.py); the others (e.g. cp with a pipeline, Megatron's encoder replicated over
cp, which the engine's first_stage cannot express) are labelled modelled. Search policy, not
validity: at least pp micro-batches for a pipeline of pp stages (fewer leaves stages idle for the
whole step), pp <= 16.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ..errors import HeteroConfigError
from .candidate import Candidate, StageChoice
from .enumerate import divisors, expert_degrees
from .memory import even_cut
from .validity import check_shapes

MAX_PP = 16
TUNE_TOP = 8  # first_stage candidates whose first stage's layers are tuned (the best even-cut ones)


@dataclass(frozen=True)
class ModelledSpace:
    world_size: int
    global_batch: int
    layers: int
    max_tp: int
    zero: int
    micro_batches: tuple[int, ...] | None = None
    max_micro_batches: int = 64
    experts: int = 0  # a MoE language model's experts: ep searched (enumerate.expert_degrees)


def _ok(base, adapter, cache: dict, vtp: int, ltp: int, cp: int, sp: bool) -> bool:
    key = ("shapes", vtp, ltp, cp, sp)
    if key not in cache:
        try:
            check_shapes(base, adapter, vtp, ltp, cp, sp, cache)
            cache[key] = True
        except HeteroConfigError:
            cache[key] = False
    return cache[key]


def pipeline_micro_batches(space: ModelledSpace, dp: int, pp: int) -> list[int]:
    per_dp = space.global_batch // dp
    wanted = space.micro_batches or divisors(per_dp)
    return [m for m in wanted if per_dp % m == 0 and m <= space.max_micro_batches and m >= pp]


def language_layouts(space: ModelledSpace, n: int) -> Iterator[tuple[int, int, int, int, bool]]:
    """(tp, cp, pp, dp, sequence parallel) on n ranks."""
    for pp in divisors(n):
        if pp > min(space.layers, MAX_PP):
            continue
        for tp in divisors(n // pp):
            if tp > space.max_tp:
                continue
            for cp in divisors(n // (pp * tp)):
                dp = n // (pp * tp * cp)
                if space.global_batch % dp:
                    continue
                for sp in ((False, True) if tp > 1 else (False,)):
                    yield tp, cp, pp, dp, sp


def megatron_candidates(space: ModelledSpace, base: Mapping[str, Any], adapter, cache: dict) -> list[Candidate]:
    """Megatron's single layouts, even cut (tune_cut varies the first stage's layers)."""
    out = []
    for tp, cp, pp, dp, sp in language_layouts(space, space.world_size):
        if not _ok(base, adapter, cache, tp, tp, cp, sp):
            continue
        for m, ep in itertools.product(pipeline_micro_batches(space, dp, pp), expert_degrees(space.experts, cp * dp)):
            for rc in (False, True):
                lang = StageChoice(tp, dp, cp, sp, pp=pp, recompute=rc, ep=ep)
                out.append(Candidate("first_stage", StageChoice(tp, dp, cp, recompute=rc), lang, m))
    return out


def tune_cut(cand: Candidate, layers: int) -> Iterator[Candidate]:
    """The same candidate with every first-stage layer count below the even split's."""
    for cut in first_stage_cuts(layers, cand.language.pp):
        yield Candidate(cand.placement, cand.vision, cand.language, cand.micro_batches, cand.encoder_passes,
                        cut, cand.global_batch)


def first_stage_cuts(layers: int, pp: int) -> Iterator[tuple[int, ...]]:
    """Every layer cut whose first stage has fewer layers than the even split's, the rest even."""
    if pp == 1:
        return
    even = even_cut(layers, pp)
    for first in range(1, even[0]):
        yield (first,) + even_cut(layers - first, pp - 1)


def heterogeneous_candidates(space: ModelledSpace, base: Mapping[str, Any], adapter, cache: dict
                             ) -> list[Candidate]:
    """Colocated heterogeneous candidates with a language pipeline, recompute or per-stage ZeRO."""
    n, out = space.world_size, []
    vision_tps = [t for t in divisors(n) if t <= space.max_tp]
    for tp, cp, pp, dp, sp in language_layouts(space, n):
        for vtp in vision_tps:
            vdp = n // vtp
            if not _ok(base, adapter, cache, vtp, tp, cp, sp):
                continue
            for m, ep in itertools.product(pipeline_micro_batches(space, dp, pp),
                                           expert_degrees(space.experts, cp * dp)):
                for passes in divisors(m):
                    if space.global_batch % (vdp * passes):
                        continue
                    for (rc, lz), vrc in itertools.product(features(space, pp), (False, True)):
                        lang = StageChoice(tp, dp, cp, sp, pp=pp, recompute=rc, zero=lz, ep=ep)
                        vz = space.zero if lz is not None else None
                        cand = Candidate("colocated", StageChoice(vtp, vdp, zero=vz, recompute=vrc), lang, m,
                                         passes if passes != m else None)
                        if cand.modelled_features:
                            out.append(cand)
    return out


def features(space: ModelledSpace, pp: int) -> Iterator[tuple[bool, int | None]]:
    """(language recompute, language ZeRO stage when it differs from the encoder's)."""
    for rc in (False, True):
        yield rc, None
        if pp == 1 and space.zero != 3:
            yield rc, 3


def disaggregated_candidates(space: ModelledSpace, base: Mapping[str, Any], adapter, cache: dict,
                             node_size: int = 0) -> list[Candidate]:
    """The encoder on its own ranks (the first nv), the language on the rest with a pipeline or recompute;
    nv of 1, 2, 4, ... up to half the world (whole nodes when the world is whole nodes of several)."""
    n, out = space.world_size, []
    splits = [v for v in (2 ** k for k in range(n.bit_length())) if v <= n // 2]
    if node_size and n > node_size and n % node_size == 0:  # whole nodes, as enumerate._rank_splits
        splits = [v for v in splits if v % node_size == 0]
    for nv in splits:
        sub = ModelledSpace(n - nv, space.global_batch, space.layers, space.max_tp, space.zero, space.micro_batches,
                            space.max_micro_batches, space.experts)
        for tp, cp, pp, dp, sp in language_layouts(sub, n - nv):
            for vtp in (t for t in divisors(nv) if t <= space.max_tp):
                vdp = nv // vtp
                if not _ok(base, adapter, cache, vtp, tp, cp, sp):
                    continue
                for m, ep in itertools.product(pipeline_micro_batches(sub, dp, pp),
                                               expert_degrees(space.experts, cp * dp)):
                    if space.global_batch % (vdp * m):
                        continue
                    for rc, vrc in itertools.product((False, True), (False, True)):
                        lang = StageChoice(tp, dp, cp, sp, tuple(range(nv, n)), pp=pp, recompute=rc, ep=ep)
                        vis = StageChoice(vtp, vdp, ranks=tuple(range(nv)), recompute=vrc)
                        cand = Candidate("disaggregated", vis, lang, m)
                        if cand.modelled_features:
                            out.append(cand)
    return out
