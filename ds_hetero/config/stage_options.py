"""Per-stage memory options of `hetero_parallel.stages.<name>`: recompute, zero_stage, freeze.

    "stages": {
        "vision":   {"tp": 1, "dp": 4, "zero_stage": 3, "freeze": ["tower"]},
        "language": {"tp": 2, "dp": 2, "recompute": true}
    }

recompute   false (default): keep every activation; true: recompute every transformer layer
            of the stage in its backward; N > 0: the first N layers only
zero_stage  0-3: this stage's engine runs that ZeRO stage instead of `zero_optimization.stage`
            (the other `zero_optimization` keys are shared)
freeze      false (default); true: the whole stage is frozen (no optimizer, no gradient, no
            boundary backward for an encoder); a list: parameter groups the model's adapter
            names (LLaVA: "tower", "projector") or fnmatch patterns of Hugging Face parameter
            names ("model.vision_tower.*"); the stage's other parameters train

Pure: parsed with the rest of the section (parse.py), before any collective. Whether a freeze
pattern names any parameter is a model check (models/freeze.py), run by `initialize` and by
`ds-hetero validate --model`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import HeteroConfigError

OPTION_KEYS = ("recompute", "zero_stage", "freeze")
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class StageOptions:
    """recompute: 0 off, -1 every layer, N > 0 the first N layers; zero_stage: None = the JSON's;
    freeze: False, True (whole stage) or a tuple of group names / parameter-name patterns."""

    recompute: int = 0
    zero_stage: int | None = None
    freeze: bool | tuple[str, ...] = False

    @property
    def frozen(self) -> bool:
        """The whole stage is frozen by the config (the model may freeze more: Stage.trains)."""
        return self.freeze is True

    def describe(self) -> str:
        """For the rank map: what differs from the defaults."""
        parts = []
        if self.recompute:
            parts.append("recompute all" if self.recompute < 0 else f"recompute {self.recompute} layers")
        if self.zero_stage is not None:
            parts.append(f"ZeRO {self.zero_stage}")
        if self.freeze is True:
            parts.append("frozen")
        elif self.freeze:
            parts.append("frozen: " + ", ".join(self.freeze))
        return ", ".join(parts) or "-"


def parse_stage_options(raw: Mapping[str, Any], field: str) -> StageOptions:
    """The options of one stage's mapping `raw`; `field` is `hetero_parallel.stages.<name>`."""
    return StageOptions(recompute=_recompute(raw.get("recompute", False), f"{field}.recompute"),
                        zero_stage=_zero_stage(raw.get("zero_stage"), f"{field}.zero_stage"),
                        freeze=_freeze(raw.get("freeze", False), f"{field}.freeze"))


def _recompute(value: Any, field: str) -> int:
    if value is False:
        return 0
    if value is True:
        return -1
    if isinstance(value, int) and value > 0:
        return value
    raise HeteroConfigError(field, f"must be false, true (every transformer layer of the stage) or a positive "
                            f"number of layers (the first N), got {value!r}")


def _zero_stage(value: Any, field: str) -> int | None:
    if value is None:
        return None
    # 1.0 == 1 in Python: only an int names a stage (as `pp` and `tp` take only ints)
    if isinstance(value, bool) or not isinstance(value, int) or value not in ZERO_STAGES:
        raise HeteroConfigError(field, f"must be a ZeRO stage 0, 1, 2 or 3 (overrides zero_optimization.stage for "
                                f"this stage), got {value!r}")
    return value


def _freeze(value: Any, field: str) -> bool | tuple[str, ...]:
    if isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise HeteroConfigError(field, "must be true (freeze the whole stage), false, or a non-empty list of parameter "
                            "groups (e.g. [\"tower\"]) or Hugging Face parameter-name patterns (e.g. "
                            f"[\"model.vision_tower.*\"]), got {value!r}")
