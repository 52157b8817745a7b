"""Tables of a plan: the ranked candidates, and where the time goes for the top rows."""

from __future__ import annotations

from .cost import Prediction
from .search import Plan

PARTS = ("compute", "tp", "cp", "dp", "optimizer", "boundary", "bubble")


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}" if x >= 1e7 else f"{x / 1e6:.1f}M"


def _time(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def ranked_table(plan: Plan, top: int = 10) -> str:
    wl, spec = plan.workload, plan.spec
    lines = [
        f"model {spec.family}: vision {spec.vision.params() / 1e6:.1f}M params ({spec.vision.kind}), "
        f"language {spec.language.params() / 1e6:.1f}M params; seq {wl.seq_len}, image tokens {wl.image_tokens}, "
        f"global batch {wl.global_batch}, ZeRO {wl.zero}, {wl.dtype_bytes}-byte dtype",
        f"machine {plan.machine.name}: {plan.machine.source}",
        f"{plan.stats['generated']} candidates generated, {len(plan.predictions)} valid "
        f"(cp > 1 {'on' if plan.stats['cp'] else 'off'}, sequence parallelism "
        f"{'on' if plan.stats['sequence_parallel'] else 'off'}: as `ds-hetero validate` accepts today)",
        "",
    ]
    head = f"{'#':>3} {'placement':<13} {'layout':<40} {'step':>10} {'tokens/s':>10} {'TFLOPS/dev':>10} " \
           f"{'peak GB/rank':>12} {'boundary MB':>11} {'bubble':>6} {'fits':>4}"
    lines += [head, "-" * len(head)]
    for i, p in enumerate(plan.predictions[:top], 1):
        lines.append(_row(i, p))
    homog = plan.best_homogeneous()
    if homog is not None and plan.best.fits:
        gain = homog.step_s / plan.best.step_s - 1
        rank = plan.predictions.index(homog) + 1
        lines.append("")
        lines.append(f"best single layout (#{rank}: {homog.candidate.label()}): {_time(homog.step_s)}; "
                     f"the top pick is predicted {100 * gain:+.1f}% tokens/s over it")
    return "\n".join(lines)


def _row(i: int, p: Prediction) -> str:
    c = p.candidate
    return (f"{i:>3} {c.placement:<13} {c.label():<40} {_time(p.step_s):>10} {p.tokens_per_s:>10.0f} "
            f"{p.tflops_per_device:>10.3f} {'/'.join(_gb(v) for v in p.peak_memory.values()):>12} "
            f"{p.boundary_bytes / 2**20:>11.2f} {100 * p.bubble:>5.0f}% {'yes' if p.fits else 'NO':>4}")


def breakdown_table(plan: Plan, top: int = 3) -> str:
    lines = ["predicted time per step and stage (seconds on one rank of the stage):"]
    head = f"{'#':>3} {'stage':<9} " + " ".join(f"{p:>10}" for p in PARTS)
    lines += [head]
    for i, p in enumerate(plan.predictions[:top], 1):
        for stage, parts in p.breakdown.items():
            lines.append(f"{i:>3} {stage:<9} " + " ".join(f"{parts.get(k, 0.0):>10.4f}" for k in PARTS))
    lines.append("compute = GEMMs + element-wise work; tp / cp = their collectives; dp = gradient reduction "
                 "(and ZeRO's parameter gathers); boundary = both exchanges; bubble = idle waiting for the "
                 "other rank set (disaggregated)")
    return "\n".join(lines)
