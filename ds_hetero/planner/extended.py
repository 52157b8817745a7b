"""The search beyond the enumeration's candidates: a pipelined language stage, first_stage (Megatron's
single layout, its first stage's layers tuned), fewer encoder passes, recompute and per-stage
ZeRO, from modelled.py's generators (its language layouts (tp, cp, pp, dp, sequence parallel) and
micro-batch policy (at least pp micro-batches, pp <= 16), its language features (recompute; ZeRO 3
for the language when the config's stage is lower and pp = 1), its first-stage cuts).

One encoder (`extended_one`): modelled.py's candidates, each priced; runnable when the engine's
checks accept its config, else modelled only (the table shows what the engine cannot run yet);
a candidate whose lighter sibling fits and runs is not priced (dominance.py).

Several encoders (`extended_several`): only candidates the engine's checks accept are kept, over
enumerate.py's rank splits per placement:

    pipelined       every placement's split with language pp > 1, each encoder in each of its layouts
    fewer passes    colocated only: each encoder any number of passes dividing the micro-batches
                    (the engine pairs passes with micro-batches one for one in the other placements)
    first_stage     every encoder at the language's tp and dp on its first pipeline stage (the
                    Megatron baseline; recompute on every stage or none); the best few with every
                    smaller first stage (`first_stage_cuts`)
    features        each candidate with recompute per stage and the language's ZeRO, lighter
                    (fewer features) first

Dominance (dominance.py): a candidate whose lighter sibling fits and
runs is skipped, and so are its own heavier siblings (`Dominance.skip`), so a model that fits
without them pays for no feature. Validity: `EngineVerdicts`, i.e. `check_candidate` only; a
stage's sizes that the checks refuse for the model's shapes on a probe (`StageShapes`) are not
generated (planning speed: at 8 ranks they were most of the refusals).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator, Mapping

from .candidate import Candidate, StageChoice
from .cost import Prediction
from .dominance import Dominance
from .enumerate import SearchSpace, divisors, expert_degrees, rank_splits, stage_layouts
from .machine import MachineProfile
from .modelled import (TUNE_TOP, ModelledSpace, disaggregated_candidates, features, first_stage_cuts,
                       heterogeneous_candidates, language_layouts, megatron_candidates, pipeline_micro_batches,
                       tune_cut)
from ..models.shapes import ModelSpec
from .step_model import predict
from .validity import StageShapes
from .verdicts import EngineVerdicts
from .workload import Workload


def extended_one(spec: ModelSpec, wl: Workload, machine: MachineProfile, limit: float | None, base, adapter,
                 space: SearchSpace, times: dict, client_opt: bool = False, runnable: Iterable[Prediction] = (),
                 counts: dict | None = None) -> list[Prediction]:
    """One encoder: Megatron's single layouts (with their cut tuned) and heterogeneous candidates with
    a pipeline, first_stage, recompute or per-stage ZeRO; each runnable when the engine's checks
    accept its config, modelled (priced only) when they refuse it. `runnable`: the enumeration's
    predictions (their lighter siblings for dominance); `times`: the plan's cache; `counts["pruned"]`, if
    given, counts the candidates skipped for a lighter sibling (so the plan's counts add up)."""
    world, placements = space.world_size, space.placements
    ms = ModelledSpace(world, wl.global_batch, spec.language.layers, space.max_tp, wl.zero, space.micro_batches,
                       experts=space.experts)
    cache: dict = {}
    verdicts = EngineVerdicts(base, world, adapter, client_opt)
    dominance = Dominance()
    for pred in runnable:
        dominance.record(pred)

    def priced(cands):
        out = []
        for c in cands:  # generated with each feature off before on, so the lighter siblings come first
            if dominance.dominated(c):
                if counts is not None:
                    counts["pruned"] = counts.get("pruned", 0) + 1
                continue
            pred = predict(c, spec, wl, machine, limit, runnable=verdicts.accepts(c), cache=times)
            dominance.record(pred)
            out.append(pred)
        return out

    meg = priced(megatron_candidates(ms, base, adapter, cache))
    meg.sort(key=lambda p: (not p.fits, -p.tokens_per_s))
    tuned = []
    for p in meg[:TUNE_TOP]:  # tune the first stage's layers of the best few even-cut layouts
        tuned += priced(tune_cut(p.candidate, spec.language.layers))
    out = meg + tuned
    if "colocated" in placements:
        out += priced(heterogeneous_candidates(ms, base, adapter, cache))
    if "disaggregated" in placements:
        node = machine.devices_per_node if machine.devices_per_node < world else 0
        out += priced(disaggregated_candidates(ms, base, adapter, cache, node))
    return out


def pipelined(space: SearchSpace, ms: ModelledSpace, names: tuple[str, ...], shapes: StageShapes, cp_ok: bool,
              sp_ok: bool) -> Iterator[Candidate]:
    """Every placement's rank split with a language pipeline (pp > 1)."""
    for placement, l_ranks, blocks in rank_splits(space, names):
        nl = len(l_ranks) or space.world_size
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
            for m, ep in itertools.product(pipeline_micro_batches(sub, dp, pp), expert_degrees(ms.experts, cp * dp)):
                lang = StageChoice(tp, dp, cp, sp, l_ranks, pp=pp, ep=ep)
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
        for m, ep in itertools.product(pipeline_micro_batches(ms, dp, pp), expert_degrees(ms.experts, cp * dp)):
            yield Candidate("first_stage", encoders, StageChoice(tp, dp, cp, sp, pp=pp, ep=ep), m)


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


def extended_several(space: SearchSpace, base: Mapping[str, Any], adapter, names: tuple[str, ...], layers: int,
                         zero: int, price: Callable[[Candidate], Prediction], priced: Iterable[Prediction],
                         cp_ok: bool, sp_ok: bool, client_opt: bool = False) -> tuple[list[Prediction], dict]:
    """Several encoders: (predictions of the accepted extended candidates, stats). `priced`: the
    enumeration's predictions (their lighter siblings for dominance; their passes and feature
    variants are searched here); `price`: step_model.predict for this plan."""
    ms = ModelledSpace(space.world_size, space.global_batch, layers, space.max_tp, zero, space.micro_batches,
                       space.max_micro_batches, space.experts)
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
