"""A run's figures from its steps' results on one rank: losses, throughput, step time, boundary bytes.

The figures every entry point can compute alone (the loss and grad norm are global; times are this
rank's); the main job adds what needs every rank (peak memory, bubble, data wait per rank). One
dict, the keys `--summary-json` writes and summary_text.py prints: a new figure (TFLOP/s, MFU) is
a key here and a row there. Timings are means over the second half of the run (after warm-up).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..result import StepResult


def warm_steps(history: Sequence[StepResult]) -> Sequence[StepResult]:
    """The second half of the run: the steps timings average over."""
    return history[len(history) // 2:]


def step_figures(history: Sequence[StepResult]) -> dict[str, Any]:
    if not history:
        return {"steps": 0}
    tail = warm_steps(history)
    seconds = sum(r.step_time for r in tail) or float("inf")
    language = [r.language_tokens for r in history]
    computed = sum(t.get("computed", 0) for t in language)
    return {
        **_throughput(tail, seconds),
        "steps": len(history),
        "first_loss": history[0].loss,
        "last_loss": history[-1].loss,
        "final_loss": sum(r.loss for r in history[-10:]) / min(10, len(history)),  # mean of the last 10 steps
        "last_grad_norm": history[-1].grad_norm,
        "losses": [r.loss for r in history],
        "grad_norms": [r.grad_norm for r in history],
        "tokens_per_s": sum(r.num_tokens for r in tail) / seconds,  # label tokens
        # the language stage's tokens: real (the samples') and computed (every dp rank's rows, padding included)
        "language_tokens_per_s_real": sum(r.language_tokens.get("real", 0) for r in tail) / seconds,
        "language_tokens_per_s_computed": sum(r.language_tokens.get("computed", 0) for r in tail) / seconds,
        "samples_per_s": sum(r.num_samples for r in tail) / seconds,
        "median_step_s": sorted(r.step_time for r in tail)[len(tail) // 2],
        "boundary_forward_bytes_per_step": sum(r.boundary_bytes_total for r in history) / len(history),
        "boundary_forward_lower_bound_per_step": sum(r.boundary_bytes_lower_bound for r in history) / len(history),
        # real / computed language tokens and the slowest language dp rank's load over the mean
        # (hetero_parallel.language_batching, docs/packing.md)
        "language_real_token_fraction": sum(t.get("real", 0) for t in language) / max(1, computed),
        "language_max_mean_load": sum(t.get("max_mean", 1.0) for t in language) / len(history),
    }


def _throughput(tail: Sequence[StepResult], seconds: float) -> dict[str, Any]:
    """TFLOP/s per device and MFU over the timed steps (throughput/meter.py; none where the steps have
    no figures): the scopes `model` and `language` over the job's devices, each stage over its own."""
    per_device: dict[str, float] = {}  # FLOPs per device, summed over the steps
    for r in tail:
        for key, value in r.throughput.items():
            if key.startswith("tflops_per_device/"):
                name = key.split("/", 1)[1]
                per_device[name] = per_device.get(name, 0.0) + value * 1e12 * r.step_time
    if not per_device:
        return {}
    peak = tail[-1].throughput.get("peak_flops_per_device", 0.0)
    out: dict[str, Any] = {}
    for scope in ("model", "language"):
        out[f"tflops_per_device_{scope}"] = per_device.pop(scope) / seconds / 1e12
        if peak:
            out[f"mfu_{scope}"] = out[f"tflops_per_device_{scope}"] * 1e12 / peak
    out["tflops_per_device_per_stage"] = {name.removeprefix("stage/"): v / seconds / 1e12
                                          for name, v in per_device.items()}
    return out
