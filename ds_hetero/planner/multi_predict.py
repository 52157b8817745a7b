"""One multi-encoder candidate -> predicted step time, throughput, memory, where the time goes.

Each encoder is priced as the single-encoder cost model prices "the" encoder, through its
`MultiSpec.view` and a workload whose image tokens are that encoder's boundary rows per sample
(cost.py's `stage_times`, memory.py's `vision_memory`); the language model as there. Each
encoder's exchange gets its own rows from the boundary's own plan (boundary_cost.py `_rows`),
between its layout and the language's, colocated when it runs on the language's ranks.

Combining (pipeline.py's formulas):
    the language's ranks run, per micro-batch, every encoder placed on them, the language
    forward and backward, and every encoder's exchanges (the engine runs them one after the
    other); with no encoder apart that is `colocated_step`.
    an encoder on ranks of its own is the vision side of `disaggregated_step` against the
    language's ranks (whose time per micro-batch includes the encoders they also run); the
    apart encoders run concurrently on disjoint ranks, so the step is the slowest of those
    pipelines.
"""

from __future__ import annotations

from dataclasses import replace

from ..topology.layout import StageLayout
from .boundary_cost import _rows
from .candidate import Candidate, StageChoice
from .cost import Prediction, engine_syncs, stage_times
from .encoders import MultiSpec
from .flops import language_work, vision_work
from .machine import MachineProfile
from .memory import language_memory, vision_memory
from .multi_candidate import MultiCandidate
from .pipeline import StageTimes, colocated_step, disaggregated_step
from .step_model import TINY, _memo
from .workload import Workload


def encoder_workloads(spec: MultiSpec, wl: Workload, rows: dict[str, int]) -> dict[str, Workload]:
    """Each encoder's workload: the language's, with that encoder's boundary rows per sample."""
    return {name: replace(wl, image_tokens=rows[name]) for name in spec.names}


def _exchange(cand: MultiCandidate, name: str, wl: Workload, spec: MultiSpec, machine: MachineProfile
              ) -> tuple[float, float]:
    """(seconds per exchange of encoder `name`, forward + backward bytes per exchange)."""
    e, lang = dict(cand.encoders)[name], cand.language
    apart = cand.apart(name)
    nv, nl = e.tp * e.dp, lang.tp * lang.cp * lang.dp
    l_ranks = tuple(lang.ranks or range(nl))
    src = StageLayout(name, e.tp, 1, e.dp, tuple(e.ranks) if apart else l_ranks)
    dst = StageLayout("language", lang.tp, lang.cp, lang.dp, l_ranks, sequence_parallel=lang.sequence_parallel)
    b, m = wl.global_batch, cand.micro_batches
    fwd, bwd = _rows(src, dst, "disaggregated" if apart else "colocated", b // m, b // (e.dp * m), b // m,
                     b // (lang.dp * m), wl.image_tokens, wl.seq_len)
    row_bytes = spec.language.hidden * spec.encoder(name).boundary_levels * wl.dtype_bytes
    peers = nl + (nv if apart else 0)
    t = (2 if apart else 1) * machine.collective_time("all_reduce", TINY, peers)  # the exchanges' consensus
    for n_rows in (fwd, bwd):
        if n_rows:  # the busiest receiver takes rows / nl of them
            t += machine.collective_time("all_to_all", n_rows * row_bytes / nl, peers)
    return t, (fwd + bwd) * row_bytes


def _sum(times: list[StageTimes]) -> StageTimes:
    return StageTimes(sum(t.forward for t in times), sum(t.backward for t in times), sum(t.step for t in times))


def predict_multi(cand: MultiCandidate, spec: MultiSpec, wls: dict[str, Workload], wl: Workload,
                  machine: MachineProfile, memory_limit: float | None = None, cache: dict | None = None
                  ) -> Prediction:
    m, lang = cand.micro_batches, cand.language
    first = spec.names[0]
    lt, lpart = _memo(cache, ("language", replace(lang, ranks=()), m),
                      lambda: stage_times(spec.view(first), wl, machine, "language", lang, m))
    enc_t, enc_part, exch, exch_bytes = {}, {}, {}, 0.0
    for name, layout in cand.encoders:
        enc_t[name], enc_part[name] = _memo(
            cache, ("encoder", name, replace(layout, ranks=()), m),
            lambda: stage_times(spec.view(name), wls[name], machine, "vision", layout, m))
        exch[name], b = _exchange(cand, name, wls[name], spec, machine)
        exch_bytes += b * m
    apart = [n for n in spec.names if cand.apart(n)]
    here = [n for n in spec.names if n not in apart]
    boundary = sum(exch.values())  # the language's ranks take part in every exchange
    n_lang = lang.size
    world = n_lang + sum(dict(cand.encoders)[n].tp * dict(cand.encoders)[n].dp for n in apart)
    syncs = engine_syncs(Candidate("colocated", StageChoice(1, 1), lang, m), machine, world)
    syncs += sum(machine.collective_time("all_reduce", TINY, e.tp) for _, e in cand.encoders)
    local = _sum([enc_t[n] for n in here])
    busy = {}
    if not apart:
        step, busy["language"] = colocated_step(local, lt, boundary, m)
        busy_all = busy["language"] * world
    else:
        side = _sum([local, lt])  # the language's ranks: their encoders, then the language
        step, busy_all = 0.0, 0.0
        for n in apart:
            s, busy[n], busy["language"] = disaggregated_step(enc_t[n], side, boundary, m)
            step = max(step, s)
            e = dict(cand.encoders)[n]
            busy_all += busy[n] * e.tp * e.dp
        busy_all += busy["language"] * n_lang
    step += syncs
    if machine.compute_units and machine.compute_units < world:
        step = max(step, busy_all / machine.compute_units)
    breakdown = {n: dict(enc_part[n]) for n in spec.names}
    breakdown["language"] = dict(lpart)
    for n in breakdown:
        breakdown[n]["boundary"] = m * (exch[n] if n in exch else boundary) + syncs
        if n in busy:
            breakdown[n]["bubble"] = step - busy[n]
    bubble = max((1 - b / step for b in busy.values()), default=0.0) if apart else \
        (max(0.0, 1 - busy_all / world / step) if step else 0.0)
    memory = _memory(cand, spec, wls, wl, machine.flash_attention, apart, here)
    flops = _memo(cache, "flops", lambda: model_flops(spec, wls, wl, machine.causal))
    limit = memory_limit if memory_limit is not None else machine.memory_bytes
    return Prediction(
        candidate=cand, step_s=step, tokens_per_s=wl.global_batch * wl.seq_len / step,
        tflops_per_device=flops / step / world / 1e12, peak_memory=memory, boundary_bytes=exch_bytes,
        bubble=bubble, breakdown=breakdown, fits=max(memory.values()) <= limit, runnable=True)


def _memory(cand, spec, wls, wl, flash, apart, here) -> dict[str, float]:
    """Peak bytes per rank set: the language's ranks (with the encoders they run), each apart encoder's."""
    def as_single(name):
        return Candidate("disaggregated" if name in apart else "colocated", dict(cand.encoders)[name],
                         cand.language, cand.micro_batches)

    def enc(name, in_flight):
        return vision_memory(spec.view(name), wls[name], as_single(name), flash, in_flight).total

    lang = language_memory(spec.view(spec.names[0]), wl, as_single(spec.names[0]), flash, 0, 1).total
    out = {"language": lang + sum(enc(n, 1) for n in here)}
    for n in apart:  # one stage ahead of the language's: two passes in flight (1F1B)
        out[n] = enc(n, min(2, cand.micro_batches))
    return out if apart else {"all": out["language"]}


def model_flops(spec: MultiSpec, wls: dict[str, Workload], wl: Workload, causal: float) -> int:
    """Training FLOPs of one step of the whole model (tp = cp = 1, the whole batch)."""
    return (sum(vision_work(spec.view(n), wls[n], wl.global_batch, 1).flops for n in spec.names)
            + language_work(spec.view(spec.names[0]), wl, wl.global_batch, 1, 1, causal).flops)
