"""One candidate -> predicted step time, throughput, memory and where the time goes.

Every encoder is priced through `Candidate.view(name)` (that encoder and the language as one
candidate), `ModelSpec.view(name)` and `Workload.of(name)` (its boundary rows per sample as image
tokens): its stage times (cost.py, with its own passes), its exchange (`boundary_seconds`), its
memory (memory.py). The placement combines them (step_time.py):

    colocated       every encoder on every rank: one after the other with the language per
                    micro-batch (`colocated_step`); with a pipeline or fewer passes each encoder's
                    first forward and last backward outside the language's 1F1B, its other passes
                    in the pipeline's idle time (`colocated_encoders_step`)
    first_stage     every encoder inside each micro-batch of the first pipeline stage
    apart           an encoder on ranks of its own (disaggregated, mixed) is one stage ahead of the
                    language's ranks (`disaggregated_step`, with a pipeline
                    `disaggregated_pipeline_step`), whose time per micro-batch includes the
                    encoders they also run; apart encoders run concurrently on disjoint ranks: the
                    step is the slowest of these.
 Boundary rows come from the
boundary's own plan when the engine's placement rules cover the candidate (colocated or
disaggregated, no pipeline) and from `modelled_rows` otherwise; an exchange that moves no row
costs nothing (the engine skips it: boundary/communicator.py), but the engine's consensus
all-reduce before each exchange stays. Between pipeline stages each micro-batch sends its
activations [tokens / cp (/ tp with sequence parallelism), hidden] forward and their gradient
back (point to point, priced as a 2-rank all-to-all over the link the stages share). An encoder
that does not train (wl.freeze) gets no row gradients: its exchange runs one way only.
"""

from __future__ import annotations

from dataclasses import replace

from ..layout import StageLayout
from .boundary_cost import exchange_rows, modelled_rows
from .candidate import Candidate
from .cost import Prediction, engine_syncs, stage_times
from .flops import language_work, vision_work
from .machine import MachineProfile
from .memory import even_cut, memo, peak_memory
from ..models.shapes import ModelSpec
from .step_time import (StageTimes, colocated_encoders_step, colocated_step, disaggregated_pipeline_step,
                        disaggregated_step, first_stage_step)
from .language_mix import language_shape, whole_batch
from .workload import Workload

TINY = 64  # bytes of the engine's small agreement all-reduces


def _plan_rows(cand: Candidate, wl: Workload) -> tuple[int, int]:
    """Rows of one exchange from the boundary plan (placements the engine runs without a pipeline)."""
    v, lang = cand.vision, cand.language
    nv, nl = v.tp * v.dp, lang.tp * lang.cp * lang.dp
    if cand.disaggregated:
        v_ranks, l_ranks = tuple(v.ranks or range(nv)), tuple(lang.ranks or range(nv, nv + nl))
    else:
        v_ranks = l_ranks = tuple(range(nv))
    src = StageLayout("vision", v.tp, 1, v.dp, v_ranks)
    dst = StageLayout("language", lang.tp, lang.cp, lang.dp, l_ranks, sequence_parallel=lang.sequence_parallel)
    b, p, m = wl.global_batch, cand.passes, cand.micro_batches
    placement = "disaggregated" if cand.disaggregated else "colocated"
    return exchange_rows(src, dst, placement, b // p, b // (v.dp * p), b // m, b // (lang.dp * m), wl.image_tokens,
                 wl.seq_len)


def boundary_seconds(cand: Candidate, spec: ModelSpec, wl: Workload, machine: MachineProfile
                     ) -> tuple[float, float]:
    """(seconds per exchange, forward + backward bytes per exchange)."""
    if cand.language.pp == 1 and not cand.megatron:
        fwd_rows, bwd_rows = _plan_rows(cand, wl)
    else:
        fwd_rows, bwd_rows = modelled_rows(cand, wl.global_batch // cand.passes, wl.image_tokens)
    row_bytes = spec.language.hidden * spec.vision.boundary_levels * wl.dtype_bytes  # Qwen3-VL: + DeepStack levels
    trains = wl.freeze.of("vision").trains
    if not trains:  # no row gradients back to an encoder that does not train
        bwd_rows = 0
    lang = cand.language
    n_dst = lang.tp * lang.cp * lang.dp  # ranks of the first (or only) language pipeline stage
    peers = n_dst + (cand.vision.tp * cand.vision.dp if cand.disaggregated else 0)
    if lang.pp > 1 and not cand.disaggregated:
        peers = cand.vision.tp * cand.vision.dp
    t = 0.0
    if not cand.megatron:  # the consensus all-reduce (exchange), and exchange_grads' when disaggregated
        t += (2 if cand.disaggregated and trains else 1) * machine.collective_time("all_reduce", TINY, peers)
    for rows in (fwd_rows, bwd_rows):
        if rows:  # the busiest receiver takes rows / n_dst of them
            t += machine.collective_time("all_to_all", rows * row_bytes / n_dst, peers)
    return t, (fwd_rows + bwd_rows) * row_bytes


def _p2p(cand: Candidate, spec: ModelSpec, wl: Workload, machine: MachineProfile) -> float:
    lang = cand.language
    samples = wl.global_batch // (lang.dp * cand.micro_batches)
    if wl.lengths:
        samples, wl = language_shape(spec, wl, lang, cand.micro_batches)
    tokens = samples * wl.seq_len / lang.cp / (lang.tp if lang.sequence_parallel else 1)
    per_stage = lang.tp * lang.cp * lang.dp
    return machine.collective_time("all_to_all", tokens * spec.language.hidden * wl.dtype_bytes * 2, 2,
                                   span=per_stage + 1)


def language_chunks(cand: Candidate, spec: ModelSpec, wl: Workload, machine: MachineProfile,
                    cache: dict | None = None) -> tuple[list[StageTimes], list[dict[str, float]]]:
    """(times, breakdown) of each language pipeline stage on one of its ranks, with the point to
    point activations between stages (one stage when pp = 1)."""
    m, lang = cand.micro_batches, cand.language
    cut = cand.pp_layers or even_cut(spec.language.layers, lang.pp)
    chunks, parts = [], []
    p2p = _p2p(cand, spec, wl, machine) if lang.pp > 1 else 0.0
    lang_key = replace(lang, ranks=())
    for s, layers in enumerate(cut):
        t, part = memo(cache, ("language", lang_key, m, layers, s == 0, s == lang.pp - 1),
                        lambda: stage_times(spec, wl, machine, "language", lang, m, layers, s == 0, s == lang.pp - 1))
        part = dict(part)
        if p2p:
            t = StageTimes(t.forward + p2p / 2, t.backward + p2p / 2, t.step)
            part["pipeline p2p"] = m * p2p
        chunks.append(t)
        parts.append(part)
    return chunks, parts


NOTHING = StageTimes(0.0, 0.0, 0.0)


def _sum(times: list[StageTimes]) -> StageTimes:
    return StageTimes(sum(t.forward for t in times), sum(t.backward for t in times), sum(t.step for t in times))


def _own(cache: dict | None, name: str) -> dict | None:
    """Encoder `name`'s own cache (memory.py's keys name the layout, not the encoder)."""
    return None if cache is None else cache.setdefault(("encoder cache", name), {})


def _combine(cand: Candidate, enc_t: dict, passes: dict, exch: dict, chunks: list[StageTimes]
             ) -> tuple[float, dict[str, float]]:
    """(step seconds before the engine's syncs, busy seconds per rank set: "language" or "all", each
    apart encoder) of the placement, from every encoder's times per pass, passes and exchange."""
    m, lang, names = cand.micro_batches, cand.language, cand.names
    apart = [n for n in names if cand.apart(n)]
    here = [n for n in names if n not in apart]
    if cand.megatron:
        step, busy = first_stage_step(_sum([enc_t[n] for n in names]), chunks, m)
        return step, {"all": busy}
    if not apart:
        if lang.pp == 1 and not cand.encoder_passes and len(names) == 1:  # (several: the same sum, as below)
            step, busy = colocated_step(enc_t[names[0]], chunks[0], exch[names[0]], m)
        else:
            step, busy = colocated_encoders_step([(enc_t[n], passes[n], exch[n]) for n in names], chunks, m)
        return step, {"all": busy}
    boundary = sum(exch.values())  # per micro-batch: apart placements pair passes with micro-batches
    busy: dict[str, float] = {}
    step = 0.0
    if lang.pp == 1:
        side = _sum([enc_t[n] for n in here] + [chunks[0]])  # the language's ranks: their encoders, the language
        for n in apart:
            s, busy[n], busy["language"] = disaggregated_step(enc_t[n], side, boundary, m)
            step = max(step, s)
    else:
        own = [(enc_t[n], passes[n], exch[n]) for n in here] + [(NOTHING, passes[n], exch[n]) for n in apart]
        step, busy["language"] = colocated_encoders_step(own, chunks, m)
        for n in apart:
            s, busy[n], _ = disaggregated_pipeline_step(enc_t[n], chunks, boundary, m)
            step = max(step, s)
    return step, busy


def predict(cand: Candidate, spec: ModelSpec, wl: Workload, machine: MachineProfile,
            memory_limit: float | None = None, runnable: bool = True, cache: dict | None = None) -> Prediction:
    """`cache`: a dict the caller keeps for one (spec, workload, machine) while ranking many candidates."""
    if cand.global_batch is not None:
        wl = replace(wl, global_batch=cand.global_batch)
        cache = None  # keys below assume the workload's batch
    m, lang, names = cand.micro_batches, cand.language, cand.names
    first = names[0]
    chunks, parts = language_chunks(cand.view(first), spec.view(first), wl, machine, cache)
    enc_t, enc_part, exch, passes, exch_bytes = {}, {}, {}, {}, 0.0
    for name in names:
        layout, view, ewl = cand.encoder(name), cand.view(name), wl.of(name)
        passes[name] = m if cand.megatron else cand.passes_of(name)
        enc_t[name], enc_part[name] = memo(
            _own(cache, name), ("encoder", replace(layout, ranks=()), passes[name]),
            lambda: stage_times(spec.view(name), ewl, machine, "vision", layout, passes[name]))
        exch[name], b = boundary_seconds(view, spec.view(name), ewl, machine)
        exch_bytes += b * passes[name]
    apart = [n for n in names if cand.apart(n)]
    world = lang.size + sum(cand.encoder(n).tp * cand.encoder(n).dp for n in apart)
    syncs = engine_syncs(cand, machine, world)
    step, busy = _combine(cand, enc_t, passes, exch, chunks)
    busy_all = busy["all"] * world if "all" in busy else (
        sum(busy[n] * cand.encoder(n).tp * cand.encoder(n).dp for n in apart) + busy["language"] * lang.size)
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
    memory = peak_memory(spec, wl, cand, machine.flash_attention, cache, machine.heap_keeps_activations)
    flops = memo(cache, "flops", lambda: model_flops(spec, wl, machine.causal))
    limit = memory_limit if memory_limit is not None else machine.memory_bytes
    return Prediction(
        candidate=cand, step_s=step, tokens_per_s=wl.real_tokens() / step,
        tflops_per_device=flops / step / world / 1e12, peak_memory=memory, boundary_bytes=exch_bytes,
        bubble=bubble, breakdown=breakdown, fits=max(memory.values()) <= limit, runnable=runnable)


def model_flops(spec: ModelSpec, wl: Workload, causal: float) -> int:
    """Training FLOPs of one step of the whole model (tp = cp = 1, the whole batch)."""
    samples, lwl = whole_batch(wl) if wl.lengths else (wl.global_batch, wl)
    return (sum(vision_work(spec.view(n), wl.of(n), wl.global_batch, 1).flops for n in spec.names)
            + language_work(spec.view(spec.names[0]), lwl, samples, 1, 1, causal).flops)
