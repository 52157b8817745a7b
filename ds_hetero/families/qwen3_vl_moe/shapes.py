"""The planner's shapes of Qwen3-VL-MoE: none yet. The planner has no expert-parallel axis (no ep in its
search, no dispatch all-to-all in its cost model), so it refuses the family by name rather than price its
experts as a dense MLP."""

from __future__ import annotations

from typing import Any


def shapes(cfg: Any):
    raise ValueError("qwen3_vl_moe: the planner has no expert-parallel axis yet (the engine trains it with "
                     "stages.language.ep; write that layout by hand)")


SHAPES = {"qwen3_vl_moe": shapes}
