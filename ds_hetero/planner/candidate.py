"""One point of the search space: a layout per encoder and the language's, the placement, micro-batches;
as a DS JSON. A model with one encoder is the case of several with one.

    placement   colocated       every stage on every rank
                disaggregated   every encoder on ranks of its own, apart from the language's
                mixed           some encoders on the language's ranks, the others apart
                first_stage     every encoder on the ranks of the language's first pipeline stage, at
                                the language's tp and dp (Megatron's single layout, the baseline)

`view(name)` is one encoder and the language as one candidate (its placement towards the language:
first_stage, disaggregated when it runs apart, else colocated): the cost model prices every
encoder through it (step_model.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import SECTION
from .frozen import carry_freeze


@dataclass(frozen=True)
class StageChoice:
    """One stage's layout. pp, recompute and zero are priced by the cost model; whether the engine
    runs a candidate is its checks' verdict on the candidate's config (`Prediction.runnable`).

    pp         pipeline stages (language only); tp x cp x dp ranks per pipeline stage
    recompute  full activation recompute of every layer
    zero       this stage's ZeRO stage (None: the DeepSpeed config's)
    ep         expert parallelism (language, a MoE model): the experts sharded over ep ranks folded
               out of the stage's cp x dp ranks (docs/expert-parallel.md)
    """

    tp: int
    dp: int
    cp: int = 1
    sequence_parallel: bool = False
    ranks: tuple[int, ...] = ()
    pp: int = 1
    recompute: bool = False
    zero: int | None = None
    ep: int = 1

    @property
    def edp(self) -> int:
        """The expert-data-parallel ranks: those holding the same experts (cp x dp / ep)."""
        return self.cp * self.dp // self.ep

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
        s += f"ep{self.ep}" if self.ep > 1 else ""
        s += "+sp" if self.sequence_parallel else ""
        s += "+rc" if self.recompute else ""
        return s + (f" Z{self.zero}" if self.zero is not None else "")


@dataclass(frozen=True)
class Candidate:
    """encoders        (stage name, layout) of each encoder in the adapter's order; a StageChoice
                       alone is a model's one encoder, the stage "vision"
    encoder_passes     (encoder, passes per step) of each encoder with fewer passes than
                       micro_batches, each pass feeding micro_batches / passes language
                       micro-batches; an int alone: the one encoder's (None: micro_batches)
    pp_layers          decoder layers of each pipeline stage (None: an even split)
    global_batch       samples per step when it differs from the workload's (disaggregated splits
                       may round the batch to one their dp sizes divide)
    """

    placement: str
    encoders: tuple[tuple[str, StageChoice], ...]
    language: StageChoice
    micro_batches: int
    encoder_passes: tuple[tuple[str, int], ...] = ()
    pp_layers: tuple[int, ...] | None = None
    global_batch: int | None = None

    def __post_init__(self):
        if isinstance(self.encoders, StageChoice):  # one encoder: the shorthand
            object.__setattr__(self, "encoders", (("vision", self.encoders),))
        passes = self.encoder_passes
        if passes is None or isinstance(passes, int):
            one = () if passes in (None, self.micro_batches) else ((self.encoders[0][0], passes),)
            object.__setattr__(self, "encoder_passes", one)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.encoders)

    def encoder(self, name: str) -> StageChoice:
        return dict(self.encoders)[name]

    @property
    def vision(self) -> StageChoice:
        """The only encoder's layout (a one-encoder candidate, or a `view`)."""
        if len(self.encoders) != 1:
            raise ValueError(f"encoders {', '.join(self.names)}: take one with view(name)")
        return self.encoders[0][1]

    def passes_of(self, name: str) -> int:
        """Encoder `name`'s passes per step (the language's micro-batches unless fewer)."""
        return dict(self.encoder_passes).get(name, self.micro_batches)

    @property
    def passes(self) -> int:
        """The only encoder's passes per step (a one-encoder candidate, or a `view`)."""
        self.vision  # raises for several encoders
        return self.passes_of(self.names[0])

    @property
    def disaggregated(self) -> bool:
        return self.placement == "disaggregated"

    @property
    def megatron(self) -> bool:
        return self.placement == "first_stage"

    @property
    def modelled_features(self) -> bool:
        """Uses a pipeline, recompute, per-stage ZeRO or first_stage: generated by modelled.py, not
        enumerate.py (and not today's baseline)."""
        return (self.megatron or self.language.pp > 1
                or any(s.recompute or s.zero is not None for s in (*dict(self.encoders).values(), self.language)))

    def apart(self, name: str) -> bool:
        """Whether encoder `name` runs on ranks of its own (not the language's)."""
        ranks = self.encoder(name).ranks
        return bool(ranks) and ranks != self.language.ranks

    @property
    def homogeneous(self) -> bool:
        """Today's single layout: colocated, every encoder in the language stage's tp x (cp dp) split as
        plain dp (not replicated over cp), no pipeline, one pass per micro-batch."""
        lang = self.language
        return self.placement == "colocated" and lang.pp == 1 and not self.encoder_passes and all(
            e.tp == lang.tp and e.dp == lang.dp * lang.cp for _, e in self.encoders)

    def view(self, name: str) -> Candidate:
        """Encoder `name` and the language as one candidate."""
        placement = "first_stage" if self.megatron else ("disaggregated" if self.apart(name) else "colocated")
        return Candidate(placement, ((name, self.encoder(name)),), self.language, self.micro_batches,
                         self.passes_of(name), self.pp_layers, self.global_batch)

    def label(self) -> str:
        if len(self.encoders) == 1:
            return self._label_one()
        tail = f" mb{self.micro_batches}" + (" cut " + "/".join(map(str, self.pp_layers)) if self.pp_layers else "")
        if self.megatron:
            rc = "".join(f" +{name} rc" for name, s in self.encoders if s.recompute)
            return f"Megatron {self.language.label()}{tail}{rc}"

        def one(name, s):
            apart = s.ranks and self.placement in ("disaggregated", "mixed")
            where = f"@{s.ranks[0]}-{s.ranks[-1]}" if apart else ""
            passes = f" enc{self.passes_of(name)}" if name in dict(self.encoder_passes) else ""
            return f"{name} {s.label()}{where}{passes}"

        return ", ".join([one(name, s) for name, s in self.encoders] + [one("L", self.language)]) + tail

    def _label_one(self) -> str:
        """The one-encoder label: V (its encoder) and L."""
        v = self.vision
        tail = f" mb{self.micro_batches}"
        if self.passes != self.micro_batches:
            tail += f" enc{self.passes}"
        if self.pp_layers is not None:
            tail += " cut " + "/".join(map(str, self.pp_layers))
        if self.global_batch is not None:
            tail += f" B{self.global_batch}"
        if self.megatron:
            return f"Megatron {self.language.label()}{tail}" + (" +V rc" if v.recompute else "")
        if self.disaggregated:
            return f"V {v.label()}@{len(v.ranks)}, L {self.language.label()}@{len(self.language.ranks)}{tail}"
        return f"V {v.label()} L {self.language.label()}{tail}"

    def section(self) -> dict[str, Any]:
        """The `hetero_parallel` section of this candidate."""
        stages = {}
        own_ranks = self.placement in ("disaggregated", "mixed") and not self._default_ranks()
        for name, s in (*self.encoders, ("language", self.language)):
            st: dict[str, Any] = {"tp": s.tp, "dp": s.dp}
            if name == "language":
                st["cp"] = s.cp
                if s.ep > 1:
                    st["ep"] = s.ep
                if s.sequence_parallel:
                    st["sequence_parallel"] = True
                if s.pp > 1:
                    st["pp"] = s.pp
                    if self.pp_layers is not None:
                        st["pp_layers"] = list(self.pp_layers)
            elif name in dict(self.encoder_passes):
                st["micro_batches"] = self.passes_of(name)
            if s.recompute:
                st["recompute"] = True
            if s.zero is not None:
                st["zero_stage"] = s.zero
            if own_ranks:
                st["ranks"] = list(s.ranks)
            stages[name] = st
        return {"placement": self.placement, "micro_batches": self.micro_batches, "stages": stages}

    def _default_ranks(self) -> bool:
        """The ranks the parser gives disaggregated stages without a `ranks` key: consecutive, in the
        stages' order (config/ranks.py). Written configs leave them out (at 1024 ranks the lists would
        dominate the checks' time while planning)."""
        if not self.disaggregated:
            return False
        start = 0
        for s in (*dict(self.encoders).values(), self.language):
            n = len(s.ranks)
            if s.ranks != tuple(range(start, start + n)):
                return False
            start += n
        return True

    def ds_config(self, base: Mapping[str, Any], extra_section: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`base` (a DeepSpeed config) with this candidate as its hetero_parallel section.

        The per-stage batch keys are dropped: ds_hetero derives them from train_batch_size.
        """
        cfg = copy.deepcopy(dict(base))
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            cfg.pop(key, None)
        cfg[SECTION] = carry_freeze(self.section(), base) | dict(extra_section or {})  # base: search.base_config
        if self.global_batch is not None:
            cfg["train_batch_size"] = self.global_batch
        return cfg
