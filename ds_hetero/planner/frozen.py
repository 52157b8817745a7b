"""What of each stage trains, as the cost model prices it: the user's `stages.<name>.freeze`.

`freeze` is not a performance knob (it decides what trains): the planner takes it from the base
config (`kept_section`), writes it into every candidate's config (`carry_freeze`: the engine's
checks then see it too), and prices what the engine does with frozen parameters:

- no gradient, no fp32 master, no Adam moments, no dp gradient reduction, no optimizer time for
  them (models/freeze.py: they are left out of the stage's optimizer; DeepSpeed reduces and
  partitions only the optimizer's parameters under ZeRO 0-2). They are held in the model dtype per
  tp rank; ZeRO 3 partitions them as it does every parameter of the module (DeepSpeed's
  parameter_offload.py converts the whole module) and gathers them in the forward.
- a stage with nothing left to train runs without an optimizer and with ZeRO 0
  (HeteroConfig.stage_ds_config): its parameters whole, no dp collective at all. An encoder that
  does not train runs its forward without autograd (Stage.__call__): no activations, no backward,
  and no boundary backward (schedule/colocated.py, disaggregated.py skip the row gradients).
- a frozen tower (every parameter before the projector; its input, the pixels, needs no gradient)
  records nothing in autograd: no backward and no activations through it; the projector's first
  linear computes its weight gradient only (its input needs none).
- a frozen language stage still back-propagates to a trained encoder's rows
  (schedule/stage_work.py): input gradients only, about one forward's GEMMs for its linears.

Other patterns (some layers, some matrices) are priced by the share of the stage's trained
parameters they freeze (states, dp reduction, optimizer); their compute is priced as if they
trained (an upper bound: autograd skips only their weight gradients).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import SECTION
from ..config.stage_options import parse_stage_options


@dataclass(frozen=True)
class StageFreeze:
    """trains     False: nothing of the stage trains (`freeze: true`, or every parameter frozen)
    tower      an encoder's tower is frozen (the adapter's "tower" group: everything before the projector)
    projector  an encoder's projector is frozen (the adapter's "projector" group)
    share      other frozen parameters, as a share of the stage's trained ones"""

    trains: bool = True
    tower: bool = False
    projector: bool = False
    share: float = 0.0

    @property
    def backward_through_tower(self) -> bool:
        """Whether an encoder's backward runs through its tower (and keeps its activations)."""
        return self.trains and not self.tower

    def frozen_params(self, params: float, projector: float = 0.0) -> float:
        """Of `params` (what one rank holds of the stage, `projector` of them the projector's), the frozen ones."""
        if not self.trains:
            return params
        frozen = (params - projector if self.tower else 0.0) + (projector if self.projector else 0.0)
        return min(params, frozen + self.share * params)

    def zero(self, zero: int) -> int:
        """The ZeRO stage the engine runs the stage with: 0 when nothing of it trains."""
        return zero if self.trains else 0

    def describe(self) -> str:
        if not self.trains:
            return "frozen"
        parts = [g for g, on in (("tower", self.tower), ("projector", self.projector)) if on]
        if self.share:
            parts.append(f"{100 * self.share:.0f}% of its parameters")
        return "frozen: " + ", ".join(parts) if parts else ""


TRAINS = StageFreeze()


@dataclass(frozen=True)
class Freeze:
    """Every stage's StageFreeze (stages not named train whole)."""

    stages: tuple[tuple[str, StageFreeze], ...] = ()

    def of(self, stage: str) -> StageFreeze:
        return dict(self.stages).get(stage, TRAINS)

    def describe(self) -> str:
        return "; ".join(f"{name} {f.describe()}" for name, f in self.stages if f.describe())

    def view(self, encoder: str) -> "Freeze":
        """Encoder `encoder`'s and the language's, the encoder's as the stage "vision" (`ModelSpec.view`)."""
        return Freeze(tuple(("vision" if name == encoder else name, f) for name, f in self.stages
                            if name in (encoder, "language")))


def freeze_values(section: Any) -> dict[str, Any]:
    """Stage -> its `freeze` value in a hetero_parallel section (checked as the parser checks it)."""
    stages = section.get("stages") if isinstance(section, Mapping) else None
    if not isinstance(stages, Mapping):
        return {}
    out = {}
    for name, raw in stages.items():
        if isinstance(raw, Mapping) and raw.get("freeze", False) is not False:
            out[name] = parse_stage_options({"freeze": raw["freeze"]}, f"{SECTION}.stages.{name}").freeze
    return out


# how the language stage cuts its samples (config/batching.py): like freeze, every candidate keeps it,
# and the planner prices it on a length mix (language_mix.py)
BATCHING_KEYS = ("language_batching", "max_tokens_per_micro_batch", "packed_attention")


def kept_section(section: Any) -> dict[str, Any] | None:
    """What of a user's hetero_parallel section every candidate keeps: each stage's `freeze`, and
    the language batching keys."""
    values = freeze_values(section)
    batching = {k: section[k] for k in BATCHING_KEYS if isinstance(section, Mapping) and k in section}
    if not values and not batching:
        return None
    kept = {"stages": {name: {"freeze": list(v) if isinstance(v, tuple) else v} for name, v in values.items()}}
    return kept | batching


def carry_freeze(section: dict[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """A candidate's `section` with the base config's `freeze` of each of its stages."""
    kept = base.get(SECTION)
    if not isinstance(kept, Mapping):
        return section
    for name, options in (kept.get("stages") or {}).items():
        if name in section["stages"] and "freeze" in options:
            section["stages"][name]["freeze"] = options["freeze"]
    section.update({k: kept[k] for k in BATCHING_KEYS if k in kept})
    return section


def resolve_freeze(section: Any, adapter) -> Freeze:
    """The Freeze of a hetero_parallel section for the model behind `adapter` (a meta model will do):
    which parameters each entry names, as the engine resolves them (models/freeze.py), counted."""
    from ..models.freeze import names_frozen_by, trainable_parameters

    values = freeze_values(section)
    if not values:
        return Freeze()
    names = names_frozen_by(values, adapter)  # HeteroConfigError when an entry names nothing
    by_name = dict(adapter.model.named_parameters())
    name_of = {id(p): n for n, p in by_name.items()}
    groups_of = getattr(adapter, "FREEZE_GROUPS", {})
    out = []
    for stage, module in adapter.split().items():
        if not names.get(stage):
            continue
        used = {id(p): p for p in trainable_parameters(module)}  # what its optimizer would take
        frozen = {id(by_name[n]) for n in names[stage]} & used.keys()

        def numel(ids):
            return sum(used[i].numel() for i in ids)

        flags, rest = {}, set(frozen)
        for group in ("tower", "projector"):
            patterns = groups_of.get(stage, {}).get(group, ())
            members = {i for i in used if any(fnmatch.fnmatch(name_of.get(i, ""), p) for p in patterns)}
            flags[group] = bool(members) and members <= frozen
            if flags[group]:
                rest -= members
        trains = frozen != used.keys()
        share = numel(rest) / numel(used) if trains and used else 0.0
        out.append((stage, StageFreeze(trains, flags["tower"], flags["projector"], share) if trains
                       else StageFreeze(trains=False)))
    return Freeze(tuple(out))
