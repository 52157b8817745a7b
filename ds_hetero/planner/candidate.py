"""One point of the search space: each stage's layout, the placement, micro-batches; as a DS JSON."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import SECTION


@dataclass(frozen=True)
class StageChoice:
    tp: int
    dp: int
    cp: int = 1
    sequence_parallel: bool = False
    ranks: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return self.tp * self.cp * self.dp

    def label(self) -> str:
        s = f"tp{self.tp}"
        if self.cp > 1:
            s += f"cp{self.cp}"
        s += f"dp{self.dp}"
        return s + ("+sp" if self.sequence_parallel else "")


@dataclass(frozen=True)
class Candidate:
    placement: str
    vision: StageChoice
    language: StageChoice
    micro_batches: int

    @property
    def disaggregated(self) -> bool:
        return self.placement == "disaggregated"

    @property
    def homogeneous(self) -> bool:
        """One shared layout: colocated, the vision stage in the language stage's tp x (cp dp) split."""
        return (not self.disaggregated and self.vision.tp == self.language.tp
                and self.vision.dp == self.language.dp * self.language.cp)

    def label(self) -> str:
        if self.disaggregated:
            return (f"V {self.vision.label()}@{len(self.vision.ranks)}, L {self.language.label()}"
                    f"@{len(self.language.ranks)} mb{self.micro_batches}")
        return f"V {self.vision.label()} L {self.language.label()} mb{self.micro_batches}"

    def section(self) -> dict[str, Any]:
        """The `hetero_parallel` section of this candidate."""
        stages = {}
        for name, s in (("vision", self.vision), ("language", self.language)):
            st: dict[str, Any] = {"tp": s.tp, "dp": s.dp}
            if name == "language":
                st["cp"] = s.cp
                if s.sequence_parallel:
                    st["sequence_parallel"] = True
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
        return cfg
