"""Tables of a plan: the ranked candidates, and where the time goes for the top rows."""

from __future__ import annotations

import math

from .cost import Prediction
from .language_mix import language_load, shards
from .search import Plan

PARTS = ("compute", "tp", "cp", "dp", "optimizer", "first touch", "pipeline p2p", "boundary", "bubble")


def _gb(x: float) -> str:
    """Bytes as GB, always GB (a tiny model's 7.1 MB is 0.0071, not "7.1M" in a GB column), two significant
    digits below 1 GB, never in exponent notation."""
    gb = x / 1e9
    if gb >= 0.1 or gb == 0:
        return f"{gb:.2f}"
    return f"{gb:.{1 - math.floor(math.log10(gb))}f}"


def counts_line(st) -> str:
    """What the search considered, in parts that add up to the total (search.py keeps them so)."""
    return (f"{st['generated']} configurations considered: {st['runnable']} runnable (the engine's checks accept "
            f"them today), {st.get('modelled', 0)} modelled only (priced by the cost model; the engine's checks refuse "
            f"them today, e.g. cp with a pipeline, ZeRO 3 with a pipeline, Megatron's encoder replicated over cp), "
            f"{st['rejected']} refused by the engine's checks, {st.get('pruned', 0)} skipped (the same layout "
            f"without its recompute or per-stage ZeRO fits, runs and is at least as fast); cp > 1 {'on' if st['cp'] else 'off'}, "
            f"sequence parallelism {'on' if st['sequence_parallel'] else 'off'}")


MEMORY_NOTE = ("peak GB/rank: the most memory one rank holds during the step (weights, gradients, optimizer state, "
               "activations), in GB; two figures a/b: the encoder's ranks / the language's (disaggregated)")


def _time(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def ranked_table(plan: Plan, top: int = 10) -> str:
    if len(plan.spec.encoders) > 1:
        return _ranked_table_several(plan, top)
    wl, spec = plan.workload, plan.spec
    st = plan.stats
    lines = [
        f"model {spec.family}: vision {spec.vision.params() / 1e6:.1f}M params ({spec.vision.kind}), "
        f"language {spec.language.params() / 1e6:.1f}M params; seq {wl.seq_len}, image tokens {wl.image_tokens} "
        f"(the encoder sees {wl.encoder_tokens(spec)}), global batch {wl.global_batch}, ZeRO {wl.zero}, "
        f"{wl.dtype_bytes}-byte dtype" + (f"; {wl.freeze.describe()} (the config's freeze, in every row)"
                                          if wl.freeze.describe() else ""),
        f"machine {plan.machine.name}: {plan.machine.source}",
        counts_line(st),
        MEMORY_NOTE,
        "",
    ]
    head = f"{'#':>3} {'runs':<8} {'placement':<13} {'layout':<46} {'step':>10} {'tokens/s':>10} " \
           f"{'TFLOPS/dev':>10} {'peak GB/rank':>12} {'boundary MB':>11} {'bubble':>6} {'fits':>4}"
    lines += [head, "-" * len(head)]
    for i, p in enumerate(plan.predictions[:top], 1):
        lines.append(_row(i, p))
    lines.append("")
    lines += mix_lines(plan)
    lines += baseline_lines(plan)
    return "\n".join(lines)


def mix_lines(plan: Plan) -> list[str]:
    """The length mix, and the language's padding and max/mean in the pick and the Megatron baseline
    (the runtime's cut of the same samples, language_mix.py)."""
    wl = plan.workload
    if not wl.lengths:
        return []
    lm, lengths = plan.spec.language, wl.lengths[:wl.global_batch]
    out = [f"length mix: {len(lengths)} samples, mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)} tokens; "
           f"language_batching {wl.batching!r} (every row priced as the runtime cuts these samples)"]
    for name, p in (("pick", plan.best_overall), ("Megatron (tuned)", plan.best_megatron())):
        if p is None:
            continue
        lang, c = p.candidate.language, p.candidate
        b = c.global_batch or wl.global_batch
        f = language_load(lengths[:b], lang.dp, c.micro_batches, shards(lang), wl.batching == "packed", wl.budget,
                          lm.hidden, lm.ffn, wl.dense)
        out.append(f"  {name}: language real/computed tokens {f['real'] / f['computed']:.3f}, "
                   f"max/mean load {f['max_mean']:.2f} (worst micro-batch), {f['step_max_mean']:.2f} (step)")
    return out + [""]


def _ranked_table_several(plan: Plan, top: int = 10) -> str:
    """The table of a model with several encoders: each encoder's layout, every row runnable."""
    spec, wl, st = plan.spec, plan.workload, plan.stats
    encoders = ", ".join(f"{n} {e.params() / 1e6:.3g}M params ({e.kind}, {st['rows'][n]} rows per sample)"
                         for n, e in spec.encoders)
    lines = [
        f"model {spec.family}: {encoders}; language {spec.language.params() / 1e6:.3g}M params; seq {wl.seq_len}, "
        f"global batch {wl.global_batch}, ZeRO {wl.zero}, {wl.dtype_bytes}-byte dtype",
        f"machine {plan.machine.name}: {plan.machine.source}",
        counts_line(st) + f"; language pipelines, first_stage, fewer encoder passes, recompute, per-stage ZeRO "
        f"{'on' if st.get('extended') else 'off'}",
        MEMORY_NOTE.replace("a/b: the encoder's ranks / the language's", "a/b/...: each rank set's, in the layout's "
                            "order"),
        "",
    ]
    head = (f"{'#':>3} {'placement':<13} {'layout (each encoder, L = language)':<60} {'step':>10} {'tokens/s':>10} "
            f"{'TFLOPS/dev':>10} {'peak GB/rank set':>16} {'boundary MB':>11} {'bubble':>6} {'fits':>4}")
    lines += [head, "-" * len(head)]
    for i, p in enumerate(plan.predictions[:top], 1):
        c = p.candidate
        lines.append(f"{i:>3} {c.placement:<13} {c.label():<60} {_time(p.step_s):>10} {p.tokens_per_s:>10.0f} "
                     f"{p.tflops_per_device:>10.3f} {'/'.join(_gb(v) for v in p.peak_memory.values()):>16} "
                     f"{p.boundary_bytes / 2**20:>11.2f} {100 * p.bubble:>5.0f}% {'yes' if p.fits else 'NO':>4}")
    lines.append("")
    best = plan.best if plan.predictions else None
    homog = plan.best_homogeneous()
    if best is not None:
        lines.append(f"pick: {best.candidate.label()} ({_time(best.step_s)})")
    if homog is not None:
        lines.append(f"baseline (every encoder in the language's layout): {homog.candidate.label()} "
                     f"({_time(homog.step_s)})")
    meg, meg_even = plan.best_megatron(), plan.best_megatron(even=True)
    if meg is not None:
        even = f"; with the even cut: {meg_even.candidate.label()} ({_time(meg_even.step_s)})" \
            if meg_even is not None and meg_even is not meg else ""
        lines.append(f"Megatron baseline, tuned (every encoder at the language's tp and dp on its first pipeline "
                     f"stage): {meg.candidate.label()} ({_time(meg.step_s)}){even}")
    gains = [f"{_gain(best, b)} vs {what}" for b, what in ((homog, "the baseline"), (meg, "the tuned Megatron baseline"))
             if b is not None]
    if best is not None and best.fits and gains:
        lines.append("pick: predicted tokens/s " + ", ".join(gains))
    return "\n".join(lines)


def _gain(a: Prediction, b: Prediction) -> str:
    return f"{100 * (a.tokens_per_s / b.tokens_per_s - 1):+.1f}%"


def baseline_lines(plan: Plan) -> list[str]:
    """The picks and the two baselines, with the gains between them, labelled."""
    out = []
    best = plan.best if plan.runnable else None
    overall = plan.best_overall if plan.predictions and plan.best_overall.fits else None
    homog = plan.best_homogeneous()
    meg, meg_even = plan.best_megatron(), plan.best_megatron(even=True)

    def name(p):
        fits = "" if p.fits else ", DOES NOT FIT"
        return f"{p.candidate.label()} ({_time(p.step_s)}, {'runnable' if p.runnable else 'modelled only'}{fits})"

    if best is not None:
        out.append(f"runnable pick: {name(best)}")
    if overall is not None and overall is not best:
        out.append(f"best overall: {name(overall)}")
    if homog is not None:
        out.append(f"today's baseline (the encoder in the language's tp x (cp dp) as plain dp): {name(homog)}")
    if meg is not None:
        out.append(f"Megatron baseline, tuned (encoder at the language's tp in the first pipeline stage, replicated "
                   f"over cp): {name(meg)}" + (f"; with the even cut: {name(meg_even)}" if meg_even else ""))
    for label, p in (("runnable pick", best), ("best overall", overall)):
        if p is None or not p.fits:
            continue
        gains = []
        if meg is not None:
            gains.append(f"{_gain(p, meg)} vs the tuned Megatron baseline")
        if homog is not None:
            gains.append(f"{_gain(p, homog)} vs today's baseline")
        if gains:
            out.append(f"{label}: predicted tokens/s " + ", ".join(gains))
    return out


def _row(i: int, p: Prediction) -> str:
    c = p.candidate
    return (f"{i:>3} {'yes' if p.runnable else 'modelled':<8} {c.placement:<13} {c.label():<46} {_time(p.step_s):>10} "
            f"{p.tokens_per_s:>10.0f} {p.tflops_per_device:>10.3f} "
            f"{'/'.join(_gb(v) for v in p.peak_memory.values()):>12} "
            f"{p.boundary_bytes / 2**20:>11.2f} {100 * p.bubble:>5.0f}% {'yes' if p.fits else 'NO':>4}")


def breakdown_table(plan: Plan, top: int = 3) -> str:
    lines = ["predicted time per step and stage (seconds on one rank of the stage):"]
    def name(stage: str) -> str:  # with what of it is frozen (the config's freeze)
        tag = plan.workload.freeze.of(stage).describe()
        return f"{stage} ({tag})" if tag else stage

    stages = {s for p in plan.predictions[:top] for s in p.breakdown}
    width = max([9] + [len(name(s)) for s in stages])
    moe = plan.spec.language.moe  # a MoE language stage: its expert-parallel exchanges in a column of their own
    columns = PARTS[:3] + ("ep",) + PARTS[3:] if moe else PARTS
    head = f"{'#':>3} {'stage':<{width}} " + " ".join(f"{p:>10}" for p in columns)
    lines += [head]
    for i, p in enumerate(plan.predictions[:top], 1):
        for stage, parts in p.breakdown.items():
            lines.append(f"{i:>3} {name(stage):<{width}} " + " ".join(f"{parts.get(k, 0.0):>10.4f}" for k in columns))
    lines.append("compute = GEMMs + element-wise work; tp / cp = their collectives; "
                 + ("ep = the experts' dispatch / combine all-to-alls, their counts and the aux loss's all-reduce; "
                    "dp includes the experts' reduction over their expert-data-parallel ranks; " if moe else "")
                 + "dp = gradient reduction "
                 "(and ZeRO's parameter gathers); first touch = page faults of the memory a CPU step maps fresh; "
                 "pipeline p2p = activations between pipeline stages; boundary = "
                 "both exchanges; bubble = idle waiting for the other rank set (disaggregated) or the pipeline's "
                 "fill and drain (language: its slowest pipeline stage)")
    return "\n".join(lines)
