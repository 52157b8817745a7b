"""One candidate -> predicted step time, throughput, memory and where the time goes.

Stage times per pass come from cost.py; the placement combines them (pipeline.py without a
language pipeline, pipeline_pp.py with one, and for first_stage). Boundary rows come from the
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
from .boundary_cost import _rows, modelled_rows
from .candidate import Candidate
from .cost import Prediction, engine_syncs, stage_times
from .flops import model_flops_per_step
from .machine import MachineProfile
from .memory import _memo, even_cut, peak_memory
from .model_spec import ModelSpec
from .pipeline import StageTimes, colocated_step, disaggregated_step
from .pipeline_pp import colocated_pipeline_step, disaggregated_pipeline_step, first_stage_step
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
    return _rows(src, dst, placement, b // p, b // (v.dp * p), b // m, b // (lang.dp * m), wl.image_tokens,
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
        t, part = _memo(cache, ("language", lang_key, m, layers, s == 0, s == lang.pp - 1),
                        lambda: stage_times(spec, wl, machine, "language", lang, m, layers, s == 0, s == lang.pp - 1))
        part = dict(part)
        if p2p:
            t = StageTimes(t.forward + p2p / 2, t.backward + p2p / 2, t.step)
            part["pipeline p2p"] = m * p2p
        chunks.append(t)
        parts.append(part)
    return chunks, parts


def predict(cand: Candidate, spec: ModelSpec, wl: Workload, machine: MachineProfile,
            memory_limit: float | None = None, runnable: bool = True, cache: dict | None = None) -> Prediction:
    """`cache`: a dict the caller keeps for one (spec, workload, machine) while ranking many candidates."""
    if cand.global_batch is not None:
        wl = replace(wl, global_batch=cand.global_batch)
        cache = None  # keys below assume the workload's batch
    m, passes, lang = cand.micro_batches, cand.passes, cand.language
    world = lang.size + (cand.vision.tp * cand.vision.dp if cand.disaggregated else 0)
    chunks, parts = language_chunks(cand, spec, wl, machine, cache)
    v_passes = m if cand.megatron else passes
    vt, vpart = _memo(cache, ("vision", replace(cand.vision, ranks=()), v_passes),
                      lambda: stage_times(spec, wl, machine, "vision", cand.vision, v_passes))
    boundary, boundary_bytes = boundary_seconds(cand, spec, wl, machine)
    syncs = engine_syncs(cand, machine, world)
    if cand.megatron:
        step, busy = first_stage_step(vt, chunks, m)
        busy_all = busy * world
    elif cand.disaggregated:
        if lang.pp == 1:
            step, busy_v, busy_l = disaggregated_step(vt, chunks[0], boundary, m)
        else:
            step, busy_v, busy_l = disaggregated_pipeline_step(vt, chunks, boundary, m)
        busy_all = busy_v * cand.vision.tp * cand.vision.dp + busy_l * lang.size
    elif lang.pp == 1 and passes == m:
        step, busy = colocated_step(vt, chunks[0], boundary, m)
        busy_all = busy * world
    else:
        step, busy = colocated_pipeline_step(vt, chunks, boundary, m, passes)
        busy_all = busy * world
    step += syncs
    if machine.compute_units and machine.compute_units < world:
        step = max(step, busy_all / machine.compute_units)
    slowest = max(range(len(chunks)), key=lambda s: chunks[s].per_micro_batch)
    breakdown = {"vision": dict(vpart), "language": dict(parts[slowest])}
    if cand.disaggregated:
        bubble = max(1 - busy_v / step, 1 - busy_l / step)
        breakdown["vision"]["bubble"] = step - busy_v
        breakdown["language"]["bubble"] = step - busy_l
    else:
        bubble = max(0.0, 1 - busy_all / world / step) if step else 0.0
        if lang.pp > 1:
            breakdown["language"]["bubble"] = bubble * step
    for stage in breakdown:
        breakdown[stage]["boundary"] = passes * boundary + syncs
    memory = peak_memory(spec, wl, cand, machine.flash_attention, cache)
    flops = _memo(cache, "flops", lambda: model_flops_per_step(spec, wl, machine.causal))
    limit = memory_limit if memory_limit is not None else machine.memory_bytes
    return Prediction(
        candidate=cand, step_s=step, tokens_per_s=wl.global_batch * wl.seq_len / step,
        tflops_per_device=flops / step / world / 1e12, peak_memory=memory,
        boundary_bytes=boundary_bytes * (0 if cand.megatron else passes), bubble=bubble, breakdown=breakdown,
        fits=max(memory.values()) <= limit, runnable=runnable)
