"""Per-stage step metrics for logs and trackers, reduced over every rank of the job.

A `StepResult` holds this rank's view: its own stages' phase times (in disaggregated placement
a rank runs only one stage), its own bubble. `StepMetrics` sums a window of steps on every rank
and `reduce()` (collective over the boundary group, once per log, not per step) combines them:

    hetero/tokens_per_s                label tokens / step time (the slowest rank's time)
    hetero/step_s                      mean step time (slowest rank)
    hetero/<stage>/<phase>_s           mean seconds per step in that stage's phase (max over ranks)
    hetero/boundary_bytes              forward bytes all ranks sent per step
    hetero/boundary_lower_bound_bytes  the forward lower bound per step (see BoundaryPlan)
    hetero/bubble_fraction             max over ranks of the mean idle share of a step
    hetero/language_real_token_fraction  real / computed language tokens (1.0: no padding; docs/packing.md)
    hetero/language_max_mean           the slowest language dp rank's cost over the mean (1.0: balanced)
    hetero/tflops_per_device/<scope>   the step's FLOPs over the job's devices and the slowest rank's step
                                       time, scope `model` (every stage) or `language` (docs/throughput.md)
    hetero/mfu/<scope>                 that over the device's peak (absent where the peak is unknown)
    hetero/tflops_per_device/stage/<name>, hetero/mfu/stage/<name>   the same over a stage's own devices

Ranks hold different keys (a vision rank has no language phases), so the window travels as
a small dict through all_gather_object rather than as a fixed-size tensor.
"""

from __future__ import annotations

from collections import defaultdict

import torch.distributed as dist

from ..result import StepResult


class StepMetrics:
    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.tokens = 0
        self.sums: dict[str, float] = defaultdict(float)

    def add(self, r: StepResult) -> None:
        self.steps += 1
        self.tokens += r.num_tokens
        self.sums["step_s"] += r.step_time
        self.sums["bubble_fraction"] += r.bubble_fraction
        self.sums["data_wait_s"] += r.data_wait  # seconds waited for this rank's rows (not in step_s's bubble)
        self.sums["boundary_bytes"] += r.boundary_bytes_total
        self.sums["boundary_lower_bound_bytes"] += r.boundary_bytes_lower_bound
        load = r.language_tokens
        if load.get("computed"):  # the plan's figures: the same on every rank
            self.sums["language_real_token_fraction"] += load["real"] / load["computed"]
            self.sums["language_max_mean"] += load["max_mean"]
        for key, value in r.throughput.items():  # FLOPs per device summed: rates from the slowest step time
            if key.startswith("tflops_per_device/"):
                self.sums["flop_per_device/" + key.split("/", 1)[1]] += value * 1e12 * r.step_time
        if r.throughput.get("peak_flops_per_device"):
            self.sums["peak_flops_per_device"] += r.throughput["peak_flops_per_device"]
        for stage, phases in r.stage_time.items():
            for phase, seconds in phases.items():
                self.sums[f"{stage}/{phase}_s"] += seconds

    def reduce(self, group) -> dict[str, float]:
        """The window's metrics, identical on every rank; resets the window. Collective over `group`
        (the engine's boundary group: every rank of every stage; explicit, never the world default)."""
        mine = {k: v / self.steps for k, v in self.sums.items()} if self.steps else {}
        tokens = self.tokens / self.steps if self.steps else 0
        self.reset()
        world = dist.get_world_size(group)
        windows = [None] * world
        dist.all_gather_object(windows, mine, group=group)
        merged: dict[str, float] = {}
        for w in windows:
            for k, v in w.items():
                merged[k] = max(merged.get(k, v), v)
        if not merged:
            return {}
        step_s, peak = merged["step_s"], merged.pop("peak_flops_per_device", 0.0)
        for key in [k for k in merged if k.startswith("flop_per_device/")]:
            name = key.split("/", 1)[1]
            rate = merged.pop(key) / step_s if step_s > 0 else 0.0
            merged[f"tflops_per_device/{name}"] = rate / 1e12
            if peak:
                merged[f"mfu/{name}"] = rate / peak
        out = {f"hetero/{k}": v for k, v in sorted(merged.items())}
        out["hetero/tokens_per_s"] = tokens / step_s if step_s > 0 else 0.0
        return out
