"""The multi-encoder candidates beyond `enumerate_multi`'s: a pipelined language stage, first_stage
(Megatron's single layout, its first stage's layers tuned), fewer encoder passes, recompute and
per-stage ZeRO; each kept when the engine's checks accept its config (the multi-encoder planner
lists only what the engine runs).

Generation reuses the single-encoder planner's (modelled.py): its language layouts
(tp, cp, pp, dp, sequence parallel) and micro-batch policy (at least pp micro-batches, pp <= 16),
its language features (recompute; ZeRO 3 for the language when the config's stage is lower and
pp = 1), its first-stage cuts, over multi_candidate.py's rank splits per placement:

    pipelined       every placement's split with language pp > 1, each encoder in each of its layouts
    fewer passes    colocated only: each encoder any number of passes dividing the micro-batches
                    (the engine pairs passes with micro-batches one for one in the other placements)
    first_stage     every encoder at the language's tp and dp on its first pipeline stage (the
                    Megatron baseline; recompute on every stage or none); the best few with every
                    smaller first stage (`first_stage_cuts`)
    features        each candidate with recompute per stage and the language's ZeRO, lighter
                    (fewer features) first

Dominance (dominance.py, with this module's siblings): a candidate whose lighter sibling fits and
runs is skipped, and so are its own heavier siblings (`Dominance.skip`), so a model that fits
without them pays for no feature. Validity: `EngineVerdicts`, i.e. `check_candidate` only; a
stage's sizes that the checks refuse for the model's shapes on a probe (`StageShapes`) are not
generated (planning speed: at 8 ranks they were most of the refusals).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator, Mapping

from .candidate import StageChoice
from .cost import Prediction
from .dominance import Dominance
from .enumerate import SearchSpace, stage_layouts, divisors
from .modelled import TUNE_TOP, ModelledSpace, features, first_stage_cuts, language_layouts, pipeline_micro_batches
from .candidate import Candidate
from .multi_candidate import StageShapes, several_splits
from .verdicts import EngineVerdicts


def pipelined(space: SearchSpace, ms: ModelledSpace, names: tuple[str, ...], shapes: StageShapes, cp_ok: bool,
              sp_ok: bool) -> Iterator[Candidate]:
    """Every placement's rank split with a language pipeline (pp > 1)."""
    for placement, nl, blocks in several_splits(space, names):
        l_ranks = () if placement == "colocated" else tuple(range(nl))
        per_encoder = []
        for name in names:
            ranks = blocks.get(name, l_ranks)
            per_encoder.append([(name, StageChoice(s.tp, s.dp, ranks=ranks))
                                for s in stage_layouts(len(ranks) or nl, space.max_tp, False, cp_ok, sp_ok)
                                if shapes.encoder(name, s.tp)])
        sub = replace(ms, world_size=nl)
        for tp, cp, pp, dp, sp in language_layouts(sub, nl):
            if pp == 1 or (cp > 1 and not cp_ok) or (sp and not sp_ok) or not shapes.language(tp, cp, sp):
                continue
            lang = StageChoice(tp, dp, cp, sp, l_ranks, pp=pp)
            for m in pipeline_micro_batches(sub, dp, pp):
                for encoders in itertools.product(*per_encoder):
                    yield Candidate(placement, tuple(encoders), lang, m)


def fewer_passes(cand: Candidate) -> Iterator[Candidate]:
    """The candidate, then (colocated) with each encoder's passes any divisor of the micro-batches."""
    yield cand
    if cand.placement != "colocated":
        return
    m, names = cand.micro_batches, [n for n, _ in cand.encoders]
    for passes in itertools.product(*(divisors(m) for _ in names)):
        fewer = tuple((n, p) for n, p in zip(names, passes) if p != m)
        if fewer:
            yield replace(cand, encoder_passes=fewer)


def megatron(ms: ModelledSpace, names: tuple[str, ...], shapes: StageShapes) -> Iterator[Candidate]:
    """Megatron's single layout: every encoder at the language's tp and dp on its first stage, even cut."""
    for tp, cp, pp, dp, sp in language_layouts(ms, ms.world_size):
        if not (shapes.language(tp, cp, sp) and all(shapes.encoder(n, tp) for n in names)):
            continue
        encoders = tuple((n, StageChoice(tp, dp)) for n in names)
        for m in pipeline_micro_batches(ms, dp, pp):
            yield Candidate("first_stage", encoders, StageChoice(tp, dp, cp, sp, pp=pp), m)


def withfeatures(cand: Candidate, ms: ModelledSpace) -> Iterator[Candidate]:
    """The candidate (first) and its recompute / ZeRO variants, lighter ones first."""
    if cand.megatron:  # Megatron's full recompute: every stage or none
        for rc in (False, True):
            yield replace(cand, encoders=tuple((n, replace(s, recompute=rc)) for n, s in cand.encoders),
                          language=replace(cand.language, recompute=rc))
        return
    for (rc, lz), enc_rc in itertools.product(features(ms, cand.language.pp),
                                              itertools.product((False, True), repeat=len(cand.encoders))):
        yield replace(cand, encoders=tuple((n, replace(s, recompute=r)) for (n, s), r in zip(cand.encoders, enc_rc)),
                      language=replace(cand.language, recompute=rc, zero=lz))


def extended_predictions(space: SearchSpace, base: Mapping[str, Any], adapter, names: tuple[str, ...], layers: int,
                         zero: int, price: Callable[[Candidate], Prediction], priced: Iterable[Prediction],
                         cp_ok: bool, sp_ok: bool, client_opt: bool = False) -> tuple[list[Prediction], dict]:
    """(predictions of the accepted extended candidates, stats). `priced`: enumerate_multi's
    predictions (their lighter siblings for dominance; their passes and feature variants are
    searched here); `price`: multi_predict.predict_multi for this plan."""
    ms = ModelledSpace(space.world_size, space.global_batch, layers, space.max_tp, zero, space.micro_batches,
                       space.max_micro_batches)
    verdicts = EngineVerdicts(base, space.world_size, adapter, client_opt)
    shapes = StageShapes(base, adapter, names)
    dominance = Dominance()
    priced = list(priced)
    seen = {p.candidate for p in priced}
    for p in priced:
        dominance.record(p)
    stats = {"generated": 0, "rejected": 0, "pruned": 0, "reasons": verdicts.reasons}

    def run(cands: Iterable[Candidate]) -> list[Prediction]:
        out = []
        for c in cands:
            if c in seen:
                continue
            seen.add(c)
            if dominance.skip(c):
                stats["pruned"] += 1
                continue
            stats["generated"] += 1
            if not verdicts.accepts(c):
                stats["rejected"] += 1
                continue
            pred = price(c)
            dominance.record(pred)
            out.append(pred)
        return out

    def variants(cands: Iterable[Candidate]) -> Iterator[Candidate]:
        for c in cands:
            for p in fewer_passes(c):
                yield from withfeatures(p, ms)

    out = run(variants(p.candidate for p in priced))
    out += run(variants(pipelined(space, ms, names, shapes, cp_ok, sp_ok)))
    meg = run(variants(megatron(ms, names, shapes)))
    meg.sort(key=lambda p: (not p.fits, -p.tokens_per_s))
    tuned = run(replace(p.candidate, pp_layers=cut) for p in meg[:TUNE_TOP]
                for cut in first_stage_cuts(layers, p.candidate.language.pp))
    return out + meg + tuned, stats
