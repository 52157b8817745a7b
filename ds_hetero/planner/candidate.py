"""One point of the search space: each stage's layout, the placement, micro-batches; as a DS JSON."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import SECTION


@dataclass(frozen=True)
class StageChoice:
    """One stage's layout. pp, recompute and zero are modelled by the cost model; the engine runs
    them once its checks accept them (`Prediction.runnable` says which candidates it runs today).

    pp         pipeline stages (language only); tp x cp x dp ranks per pipeline stage
    recompute  full activation recompute of every layer
    zero       this stage's ZeRO stage (None: the DeepSpeed config's)
    """

    tp: int
    dp: int
    cp: int = 1
    sequence_parallel: bool = False
    ranks: tuple[int, ...] = ()
    pp: int = 1
    recompute: bool = False
    zero: int | None = None

    @property
    def size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def label(self) -> str:
        s = f"tp{self.tp}"
        if self.cp > 1:
            s += f"cp{self.cp}"
        if self.pp > 1:
            s += f"pp{self.pp}"
        s += f"dp{self.dp}"
        s += "+sp" if self.sequence_parallel else ""
        s += "+rc" if self.recompute else ""
        return s + (f" Z{self.zero}" if self.zero is not None else "")


@dataclass(frozen=True)
class Candidate:
    """placement       colocated, disaggregated, or first_stage (Megatron's single layout: the encoder
                       at the language's tp on the first pipeline stage's ranks, replicated over cp,
                       with the language's dp; `vision` then repeats the language's tp, cp, dp)
    encoder_passes     encoder forward/backward passes per step (None: micro_batches), each feeding
                       micro_batches / encoder_passes language micro-batches
    pp_layers          decoder layers of each pipeline stage (None: an even split)
    global_batch       samples per step when it differs from the workload's (disaggregated splits
                       may round the batch to one their dp sizes divide)
    """

    placement: str
    vision: StageChoice
    language: StageChoice
    micro_batches: int
    encoder_passes: int | None = None
    pp_layers: tuple[int, ...] | None = None
    global_batch: int | None = None

    @property
    def passes(self) -> int:
        return self.encoder_passes or self.micro_batches

    @property
    def modelled_features(self) -> bool:
        """Uses something the engine's config does not have yet (pp, recompute, per-stage ZeRO, first_stage)."""
        return (self.placement == "first_stage" or self.language.pp > 1
                or any(s.recompute or s.zero is not None for s in (self.vision, self.language)))

    @property
    def disaggregated(self) -> bool:
        return self.placement == "disaggregated"

    @property
    def homogeneous(self) -> bool:
        """Today's single layout: colocated, the vision stage in the language stage's tp x (cp dp)
        split as plain dp (the encoder is not replicated over cp), one pass per micro-batch."""
        return (self.placement == "colocated" and self.language.pp == 1 and self.vision.tp == self.language.tp
                and self.vision.dp == self.language.dp * self.language.cp and self.passes == self.micro_batches)

    @property
    def megatron(self) -> bool:
        return self.placement == "first_stage"

    def label(self) -> str:
        tail = f" mb{self.micro_batches}"
        if self.passes != self.micro_batches:
            tail += f" enc{self.passes}"
        if self.pp_layers is not None:
            tail += " cut " + "/".join(map(str, self.pp_layers))
        if self.global_batch is not None:
            tail += f" B{self.global_batch}"
        if self.megatron:
            return f"Megatron {self.language.label()}{tail}" + (" +V rc" if self.vision.recompute else "")
        if self.disaggregated:
            return (f"V {self.vision.label()}@{len(self.vision.ranks)}, L {self.language.label()}"
                    f"@{len(self.language.ranks)}{tail}")
        return f"V {self.vision.label()} L {self.language.label()}{tail}"

    def section(self) -> dict[str, Any]:
        """The `hetero_parallel` section of this candidate."""
        stages = {}
        for name, s in (("vision", self.vision), ("language", self.language)):
            st: dict[str, Any] = {"tp": s.tp, "dp": s.dp}
            if name == "language":
                st["cp"] = s.cp
                if s.sequence_parallel:
                    st["sequence_parallel"] = True
                if s.pp > 1:  # the pipeline keys the engine's config is getting (modelled until then)
                    st["pp"] = s.pp
                    if self.pp_layers is not None:
                        st["pp_layers"] = list(self.pp_layers)
            elif self.passes != self.micro_batches:
                st["micro_batches"] = self.passes
            if s.recompute:
                st["recompute"] = True
            if s.zero is not None:
                st["zero_stage"] = s.zero
            if self.disaggregated:
                st["ranks"] = list(s.ranks)
            stages[name] = st
        return {"placement": self.placement, "micro_batches": self.micro_batches, "stages": stages}

    def ds_config(self, base: Mapping[str, Any], extra_section: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`base` (a DeepSpeed config) with this candidate as its hetero_parallel section.

        The per-stage batch keys are dropped: ds_hetero derives them from train_batch_size.
        """
        cfg = copy.deepcopy(dict(base))
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            cfg.pop(key, None)
        cfg[SECTION] = self.section() | dict(extra_section or {})
        if self.global_batch is not None:
            cfg["train_batch_size"] = self.global_batch
        return cfg
