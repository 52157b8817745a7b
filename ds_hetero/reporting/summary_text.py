"""The main job's summary as a person reads it: one labeled figure per line, with its unit.

The summary itself is a dict (what `--summary-json` writes, per-step lists included); this module
only chooses what is printed and how. Each printed figure is one `Figure` row of `FIGURES`: adding
a figure (TFLOP/s, MFU) is one row, and a figure whose key a run lacks is left out.

    loss, first step            5.5462
    loss, last step             4.6531
    loss, mean of last 10 steps 5.0634  (steps 1-5)
    ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

# Keys only --summary-json holds: too long to read in a terminal (one value per step or per rank
# and phase). The printed lines say where to find them.
JSON_ONLY = ("losses", "grad_norms", "stage_time_s_per_step", "stages_per_rank", "pipeline_last_step_per_rank")


@dataclass(frozen=True)
class Figure:
    label: str
    text: Callable[[Mapping[str, Any]], str]  # the value with its unit, from the summary dict
    needs: tuple[str, ...]  # the summary keys it reads: left out when one is missing


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 2**20 else f"{n / 2**20:,.2f} MiB"


def _per_rank(values, fmt: str, unit: str) -> str:
    """`446 446 446 445 MB per rank`: rank 0 first."""
    return " ".join(format(v, fmt) for v in values) + f" {unit} per rank"


def _last10(s) -> str:
    n = s["steps"]
    first = max(1, n - 9)
    return f"{s['final_loss']:.4f}  (steps {first}-{n})"


def _tokens(s) -> str:
    return (f"{s['language_tokens_per_s_real']:,.0f} real, {s['language_tokens_per_s_computed']:,.0f} computed "
            f"(language positions incl. padding), {s['tokens_per_s']:,.0f} label tokens/s")


def _boundary(s) -> str:
    fwd, bound = s["boundary_forward_bytes_per_step"], s["boundary_forward_lower_bound_per_step"]
    verdict = "at the lower bound" if fwd == bound else f"{fwd / bound:.2f}x the lower bound" if bound else ""
    return f"forward {_kib(fwd)} per step, lower bound {_kib(bound)} ({verdict})"


def _boundary_backward(s) -> str:
    sent, bound = s["boundary_backward_bytes_per_step"], s.get("boundary_backward_lower_bound_per_step")
    verdict = ("at the lower bound" if sent == bound else f"{sent / bound:.2f}x the lower bound" if bound
               else "above it")
    measured = "" if bound is None else f", lower bound {_kib(bound)} ({verdict})"
    return (f"backward {_kib(sent)} per step, all ranks{measured}: gradients only for rows an encoder rank holds "
            "no copy of (0 when each holds them, or frozen; docs/boundary.md)")


def _tflops(s) -> str:
    stages = ", ".join(f"{n} {v:.3g}" for n, v in s["tflops_per_device_per_stage"].items())
    return (f"{s['tflops_per_device_model']:.3g} whole model, {s['tflops_per_device_language']:.3g} language "
            f"only (FLOPs over every device of the job); per stage over its own devices: {stages}")


def _mfu(s) -> str:
    return (f"{100 * s['mfu_model']:.2f}% whole model, {100 * s['mfu_language']:.2f}% language only, of the device's "
            "peak (a GPU's datasheet, a CPU's measured GEMM; docs/throughput.md)")


def _bubble(s) -> str:
    return (_per_rank([100 * b for b in s["bubble_fraction_per_rank"]], ".1f", "%") +
            ": step time outside forward, backward and optimizer work (waits on other ranks and the boundary; "
            "the data wait apart)")


FIGURES: tuple[Figure, ...] = (
    Figure("layout", lambda s: s["layout"].removeprefix("layout: "), ("layout",)),
    Figure("steps", lambda s: f"{s['steps']}  (timings: mean of steps {s['steps'] // 2 + 1}-{s['steps']})",
           ("steps",)),
    Figure("loss, first step", lambda s: f"{s['first_loss']:.4f}", ("first_loss",)),
    Figure("loss, last step", lambda s: f"{s['last_loss']:.4f}", ("last_loss",)),
    Figure("loss, mean of last 10 steps", _last10, ("final_loss", "steps")),
    Figure("grad norm, last step", lambda s: f"{s['last_grad_norm']:.4f}  (before clipping)", ("last_grad_norm",)),
    Figure("tokens/s", _tokens, ("tokens_per_s", "language_tokens_per_s_real", "language_tokens_per_s_computed")),
    Figure("samples/s", lambda s: f"{s['samples_per_s']:.2f}", ("samples_per_s",)),
    Figure("step time", lambda s: f"{s['median_step_s']:.3f} s median", ("median_step_s",)),
    Figure("TFLOP/s per device", _tflops, ("tflops_per_device_model", "tflops_per_device_language",
                                           "tflops_per_device_per_stage")),
    Figure("MFU", _mfu, ("mfu_model", "mfu_language")),
    Figure("data wait per step", lambda s: _per_rank(s["data_wait_s_per_step_per_rank"], ".4f", "s") +
           ": the step waiting for its rows", ("data_wait_s_per_step_per_rank",)),
    Figure("boundary bytes", _boundary, ("boundary_forward_bytes_per_step", "boundary_forward_lower_bound_per_step")),
    Figure("", _boundary_backward, ("boundary_backward_bytes_per_step",)),
    Figure("peak memory", lambda s: _per_rank(s["peak_memory_mb_per_rank"], ".0f", "MB") + " (device memory on a "
           "GPU, process max RSS on CPU)", ("peak_memory_mb_per_rank",)),
    Figure("bubble", _bubble, ("bubble_fraction_per_rank",)),
    Figure("language load", lambda s: f"slowest dp rank {s['language_max_mean_load']:.2f}x the mean (1.00: "
           "balanced)", ("language_max_mean_load",)),
    Figure("wall time", lambda s: f"{s['wall_s']:.1f} s for the steps (startup not counted)", ("wall_s",)),
)


def summary_lines(summary: Mapping[str, Any], json_path: str | None = None) -> list[str]:
    """The printed summary: a title, then `label  value unit` for every figure the summary holds."""
    rows = [(f.label, f.text(summary)) for f in FIGURES if all(k in summary for k in f.needs)]
    width = max(len(label) for label, _ in rows)
    lines = ["summary"] + [f"  {label:<{width}}  {text}" for label, text in rows]
    where = f"in {json_path}" if json_path else "with --summary-json FILE"
    lines.append(f"  per-step losses and grad norms, per-phase times: {where}")
    return lines
