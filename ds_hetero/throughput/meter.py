"""TFLOP/s per device and MFU of every step, per stage and for the job, in two labeled scopes.

    shapes = ThroughputMeter.shapes_of(model, config, adapter)   # before the engine cuts the model
    meter = ThroughputMeter.build(shapes, config, device, dtype)  # None for a model the planner cannot read
    figures = meter.figures(plan, step_time)

Scopes (say which a figure has: Megatron-Bridge's cards count the whole model, lmms-engine and
NeMo Automodel the text backbone only, Automodel's `flops_scope`):
    model      every stage: the language model and every encoder with its projector
    language   the language stage alone

Per device: the job's figures divide by every device of the job (the paper's TFLOP/s per GPU);
a stage's divide by the stage's own devices (its ranks: in a colocated placement every stage holds
all of them, disaggregated each its own set). All divide by this rank's step time. MFU is TFLOP/s
per device over the device's peak (peaks.py), at the dtype the engines compute in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from ..config import LANGUAGE, SECTION
from .peaks import device_peak
from .step_flops import StepFlops

if TYPE_CHECKING:
    from ..models.shapes import ModelSpec
    from ..planner.frozen import Freeze


@dataclass
class ThroughputMeter:
    flops: StepFlops
    devices: Mapping[str, int]  # each stage's devices (ranks)
    world: int
    peak: float | None  # FLOP/s of one device, None where unknown (no MFU then)
    peak_source: str

    @staticmethod
    def shapes_of(model, config, adapter) -> "tuple[ModelSpec, Freeze] | None":
        """The model's shapes (its HF config read by the planner's shape readers) and what of each
        stage the config freezes, or None for a model the readers do not know. On the whole model,
        before the engine cuts and partitions it (a ZeRO-3 partition holds no elements to count)."""
        from ..planner.frozen import resolve_freeze
        from ..planner.model_spec import model_spec

        try:
            spec = model_spec(model.config)
        except (ValueError, TypeError, AttributeError, KeyError):
            return None
        return spec, resolve_freeze(config.ds_config.get(SECTION) or {}, adapter)

    @classmethod
    def build(cls, shapes, config, device, dtype, trains: Mapping[str, bool] | None = None
              ) -> "ThroughputMeter | None":
        """The meter of a model of `shapes` (shapes_of; None: no meter). `trains`: which stages train
        (a stage that does not is counted forward only)."""
        from ..planner.frozen import Freeze, StageFreeze

        if shapes is None:
            return None
        spec, freeze = shapes
        if trains:
            frozen = {name for name, t in trains.items() if not t}
            freeze = Freeze(tuple((n, f) for n, f in freeze.stages if n not in frozen)
                            + tuple((n, StageFreeze(trains=False)) for n in frozen))
        peak, source = device_peak(device, dtype)
        return cls(StepFlops(spec, freeze), {n: s.size for n, s in config.stages.items()}, config.world_size,
                   peak, source)

    def figures(self, plan, step_time: float) -> dict[str, float]:
        """Named figures of one step: `peak_flops_per_device` (0 where unknown), `flops/<scope>` (FLOPs of the step, all devices),
        `tflops_per_device/<scope>` and `mfu/<scope>` for the job, and the same per stage as `.../stage/<stage>` (over the stage's own devices)."""
        by_stage = self.flops.of(plan.lengths, plan.items_by_encoder())
        scopes = {"model": sum(by_stage.values()), "language": by_stage[LANGUAGE]}
        out: dict[str, float] = {"peak_flops_per_device": self.peak or 0.0}
        for scope, flops in scopes.items():
            out[f"flops/{scope}"] = float(flops)
            self._rates(out, scope, flops, self.world, step_time)
        for stage, flops in by_stage.items():
            self._rates(out, f"stage/{stage}", flops, self.devices[stage], step_time)
        return out

    def _rates(self, out: dict, name: str, flops: float, devices: int, step_time: float) -> None:
        per_device = flops / devices / step_time if step_time > 0 else 0.0
        out[f"tflops_per_device/{name}"] = per_device / 1e12
        if self.peak:
            out[f"mfu/{name}"] = per_device / self.peak
