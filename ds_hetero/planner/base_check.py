"""`ds-hetero plan --config BASE.json`: BASE passes the checks `ds-hetero validate BASE.json` runs.

Why: the planner keeps only some of BASE's `hetero_parallel` section (each stage's `freeze`, the
language batching keys: frozen.py `kept_section`) and replaces the layouts, so without this a
typo (`micro_batchs`) or a bad value (`zero_stage: 1.5`) was dropped in silence, and the plan
looked like an answer for the config the user meant.

The checks are validate's (config/parse.py, validation.py), on BASE as the planner uses it: the
global batch is `--global-batch` and an absent optimizer is the planner's default. The layouts in
BASE may be written for another world size than the one planned (the planner replaces them): they
are checked at `--world-size`, else at the world size they span themselves (all stages on the same
ranks, or each on its own); the error reported is the one at `--world-size`. A BASE without layouts
(no section, a section of batching keys, stages with only `freeze`) is checked under one-rank
placeholder layouts: its other keys as written.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from ..config import ENCODER_STAGES, SECTION, parse_config
from ..errors import HeteroConfigError
from ..validation import check_engine_support


def _spanned_world_sizes(section: Any) -> list[int]:
    """The world sizes BASE's stages span: colocated (the largest stage) and each on its own ranks (the sum)."""
    try:
        sizes = [stage.get("tp", 1) * stage.get("cp", 1) * stage["dp"] * stage.get("pp", 1)
                 for stage in section["stages"].values()]
    except (AttributeError, KeyError, TypeError):
        return []  # malformed: the check at --world-size says how
    if not all(isinstance(size, int) and size > 0 for size in sizes) or not sizes:
        return []
    return [max(sizes), sum(sizes)]


def _placeholder(section: Mapping[str, Any], global_batch: int) -> tuple[dict[str, Any], int]:
    """BASE's section with one-rank layouts in place of the missing ones (the planner supplies the layouts):
    its other keys are checked as written. (section, global batch that section's micro_batches divide)."""
    stages = section.get("stages")
    stages = stages if isinstance(stages, Mapping) else {}
    kept = {name: {k: v for k, v in stage.items() if k in PLACEHOLDER_KEPT} if isinstance(stage, Mapping) else stage
            for name, stage in stages.items()}
    kept = {**({} if len(kept) > 1 or any(n != "language" for n in kept) else {"vision": {}}), **kept}
    kept.setdefault("language", {})
    out = {**section, "placement": "colocated", "stages": {n: {**s, "dp": 1} if isinstance(s, Mapping) else s
                                                           for n, s in kept.items()}}
    mb = section.get("micro_batches", 1)
    return out, global_batch * (mb if isinstance(mb, int) and not isinstance(mb, bool) and mb > 0 else 1)


# a stage's keys that do not depend on the layout: checked as written when the layouts are the planner's
PLACEHOLDER_KEPT = ("freeze", "recompute", "zero_stage", "balance")


def check_base(base: Mapping[str, Any], world_size: int, global_batch: int, default_optimizer: Mapping) -> None:
    """HeteroConfigError (validate's) when BASE is not a valid config; an "auto" section is checked for its keys."""
    ds = copy.deepcopy(dict(base))
    ds["train_batch_size"] = global_batch
    ds.setdefault("optimizer", copy.deepcopy(dict(default_optimizer)))
    section = ds.setdefault(SECTION, {})
    if section == "auto" or (isinstance(section, Mapping) and section.get("auto") is True):
        from .auto import auto_options

        auto_options(section)
        return
    stages = section.get("stages") if isinstance(section, Mapping) else None
    with_layouts = isinstance(stages, Mapping) and stages and all(
        not isinstance(stage, Mapping) or "dp" in stage for stage in stages.values())
    if isinstance(section, Mapping) and not with_layouts:  # the layouts are left to the planner
        ds[SECTION], ds["train_batch_size"] = _placeholder(section, global_batch)
        sizes = [1]
    else:
        sizes = [world_size] + [w for w in _spanned_world_sizes(section) if w != world_size]
    first = None
    for size in sizes:
        try:
            check_engine_support(parse_config(ds, size, ENCODER_STAGES))
            return
        except HeteroConfigError as exc:
            first = first or exc
    raise first
