"""One multi-encoder candidate -> predicted step time, throughput, memory, where the time goes.

Every encoder is priced by the single-encoder cost model through `MultiCandidate.view(name)` (that
encoder and the language as one candidate), `MultiSpec.view(name)` and a workload whose image
tokens are that encoder's boundary rows per sample: its stage times (cost.py `stage_times`, with
its own passes), its exchange (step_model.py `boundary_seconds`: rows from the boundary's own plan
without a pipeline, every row priced as moved into a pipeline's first stage, nothing in
first_stage), its memory (memory.py `encoder_peak`: the passes a rank holds at once, across the
language micro-batches a pass feeds and the pipeline's in-flight ones). The language's pipeline
stages: step_model.py `language_chunks`, memory.py `language_peaks`.

Combining (pipeline.py, pipeline_pp.py):
    colocated       every encoder on every rank: `colocated_encoders_step` (each encoder's first
                    forward and last backward outside the language's 1F1B, its other passes in
                    the pipeline's idle time; without a pipeline every pass one after the other)
    first_stage     every encoder inside each micro-batch of the first pipeline stage:
                    `first_stage_step` with the encoders' times summed
    apart           an encoder on ranks of its own is one stage ahead of the language's ranks:
                    without a pipeline the encoder side of `disaggregated_step` against the
                    language's ranks (whose time per micro-batch includes the encoders they also
                    run); with one `disaggregated_pipeline_step` against the language's pipeline
                    stages, the language's ranks running their own encoders as colocated ones
                    (`colocated_encoders_step`, every exchange included). Apart encoders run
                    concurrently on disjoint ranks: the step is the slowest of these.
"""

from __future__ import annotations

from dataclasses import replace

from .candidate import Candidate, StageChoice
from .cost import Prediction, engine_syncs, stage_times
from .encoders import MultiSpec
from .flops import language_work, vision_work
from .machine import MachineProfile
from .memory import _memo, encoder_peak, language_peaks
from .multi_candidate import MultiCandidate
from .pipeline import StageTimes, disaggregated_step
from .pipeline_pp import colocated_encoders_step, disaggregated_pipeline_step, first_stage_step
from .step_model import TINY, boundary_seconds, language_chunks
from .workload import Workload

NOTHING = StageTimes(0.0, 0.0, 0.0)


def encoder_workloads(spec: MultiSpec, wl: Workload, rows: dict[str, int]) -> dict[str, Workload]:
    """Each encoder's workload: the language's, with that encoder's boundary rows per sample."""
    return {name: replace(wl, image_tokens=rows[name]) for name in spec.names}


def _sum(times: list[StageTimes]) -> StageTimes:
    return StageTimes(sum(t.forward for t in times), sum(t.backward for t in times), sum(t.step for t in times))


def _own(cache: dict | None, name: str) -> dict | None:
    """Encoder `name`'s own cache (memory.py's keys name the layout, not the encoder)."""
    return None if cache is None else cache.setdefault(("encoder cache", name), {})


def predict_multi(cand: MultiCandidate, spec: MultiSpec, wls: dict[str, Workload], wl: Workload,
                  machine: MachineProfile, memory_limit: float | None = None, cache: dict | None = None
                  ) -> Prediction:
    m, lang, names = cand.micro_batches, cand.language, spec.names
    first = names[0]
    chunks, parts = language_chunks(cand.view(first), spec.view(first), wl, machine, cache)
    layouts = dict(cand.encoders)
    enc_t, enc_part, exch, passes, exch_bytes = {}, {}, {}, {}, 0.0
    for name in names:
        layout = layouts[name]
        passes[name] = m if cand.megatron else cand.passes_of(name)
        enc_t[name], enc_part[name] = _memo(
            cache, ("encoder", name, replace(layout, ranks=()), passes[name]),
            lambda: stage_times(spec.view(name), wls[name], machine, "vision", layout, passes[name]))
        exch[name], b = boundary_seconds(cand.view(name), spec.view(name), wls[name], machine)
        exch_bytes += b * passes[name]
    apart = [n for n in names if cand.apart(n)]
    here = [n for n in names if n not in apart]
    n_lang = lang.size
    world = n_lang + sum(layouts[n].tp * layouts[n].dp for n in apart)
    syncs = engine_syncs(Candidate("colocated", StageChoice(1, 1), lang, m), machine, world)
    syncs += sum(machine.collective_time("all_reduce", TINY, e.tp) for _, e in cand.encoders)
    busy: dict[str, float] = {}
    if cand.megatron:
        step, busy["language"] = first_stage_step(_sum([enc_t[n] for n in names]), chunks, m)
        busy_all = busy["language"] * world
    elif not apart:
        step, busy["language"] = colocated_encoders_step([(enc_t[n], passes[n], exch[n]) for n in names], chunks, m)
        busy_all = busy["language"] * world
    else:
        boundary = sum(exch.values())  # per micro-batch: apart placements pair passes with micro-batches
        if lang.pp == 1:
            side = _sum([enc_t[n] for n in here] + [chunks[0]])  # the language's ranks: their encoders, the language
            step = 0.0
            for n in apart:
                s, busy[n], busy["language"] = disaggregated_step(enc_t[n], side, boundary, m)
                step = max(step, s)
        else:
            own = [(enc_t[n], passes[n], exch[n]) for n in here] + [(NOTHING, passes[n], exch[n]) for n in apart]
            step, busy["language"] = colocated_encoders_step(own, chunks, m)
            for n in apart:
                s, busy[n], _ = disaggregated_pipeline_step(enc_t[n], chunks, boundary, m)
                step = max(step, s)
        busy_all = sum(busy[n] * layouts[n].tp * layouts[n].dp for n in apart) + busy["language"] * n_lang
    step += syncs
    if machine.compute_units and machine.compute_units < world:
        step = max(step, busy_all / machine.compute_units)
    slowest = max(range(len(chunks)), key=lambda s: chunks[s].per_micro_batch)
    breakdown = {n: dict(enc_part[n]) for n in names}
    breakdown["language"] = dict(parts[slowest])
    for n in breakdown:
        breakdown[n]["boundary"] = (passes[n] * exch[n] if n in exch else sum(passes[e] * exch[e] for e in names)) \
            + syncs
    if apart:
        for n, b in busy.items():
            breakdown[n]["bubble"] = step - b
        bubble = max(1 - b / step for b in busy.values())
    else:
        bubble = max(0.0, 1 - busy_all / world / step) if step else 0.0
        if lang.pp > 1:
            breakdown["language"]["bubble"] = bubble * step
    memory = multi_memory(cand, spec, wls, wl, machine.flash_attention, cache)
    flops = _memo(cache, "flops", lambda: model_flops(spec, wls, wl, machine.causal))
    limit = memory_limit if memory_limit is not None else machine.memory_bytes
    return Prediction(
        candidate=cand, step_s=step, tokens_per_s=wl.global_batch * wl.seq_len / step,
        tflops_per_device=flops / step / world / 1e12, peak_memory=memory, boundary_bytes=exch_bytes,
        bubble=bubble, breakdown=breakdown, fits=max(memory.values()) <= limit, runnable=True)


def multi_memory(cand: MultiCandidate, spec: MultiSpec, wls: dict[str, Workload], wl: Workload, flash: bool,
                 cache: dict | None = None) -> dict[str, float]:
    """Peak bytes per rank set: {"all": ...} when every encoder runs on the language's ranks (a first
    stage's rank in first_stage), else {"language": ..., each apart encoder: ...}. A language rank
    holds its pipeline stage's in-flight micro-batches and every encoder it runs, each with its own
    passes in flight (memory.py `encoder_in_flight`)."""
    first = spec.names[0]
    lang = language_peaks(spec.view(first), wl, cand.view(first), flash, cache)
    enc = {n: encoder_peak(spec.view(n), wls[n], cand.view(n), flash, _own(cache, n)) for n in spec.names}
    if cand.megatron:  # every encoder inside the first pipeline stage
        return {"all": max([lang[0] + sum(enc.values())] + lang[1:])}
    apart = [n for n in spec.names if cand.apart(n)]
    here = sum(enc[n] for n in spec.names if n not in apart) + max(lang)
    if not apart:
        return {"all": here}
    return {"language": here} | {n: enc[n] for n in apart}


def model_flops(spec: MultiSpec, wls: dict[str, Workload], wl: Workload, causal: float) -> int:
    """Training FLOPs of one step of the whole model (tp = cp = 1, the whole batch)."""
    return (sum(vision_work(spec.view(n), wls[n], wl.global_batch, 1).flops for n in spec.names)
            + language_work(spec.view(spec.names[0]), wl, wl.global_batch, 1, 1, causal).flops)
