"""Frozen parameters: `stages.<name>.freeze` and the model's own `requires_grad=False` flags.

A parameter is frozen when the config freezes it or when the user already set
`requires_grad=False` on it (the Hugging Face habit, `model.vision_tower.requires_grad_(False)`):
both end as `requires_grad=False` on the model, set here before the stages are sharded and
cut, so every entry point (initialize, HeteroTrainer, Accelerate) sees the same flags and
tensor parallelism keeps them on its shards. A frozen parameter gets no gradient, no optimizer
state and is never updated (its values stay bit-identical). A stage with no trainable
parameter left does not train at all (`trainable_parameters` is empty): no optimizer, its
forward under no_grad, and, for an encoder, no boundary backward (stages/stage_set.py).

`freeze` entries: `true` (the whole stage), or a list of parameter groups the adapter names
(`FREEZE_GROUPS`, e.g. LLaVA's "tower" and "projector") and fnmatch patterns of the Hugging Face
parameter names (`model.named_parameters()`, e.g. "model.vision_tower.encoder.layers.0.*").
"""

from __future__ import annotations

import fnmatch
from typing import Mapping, Sequence

from torch import nn

from ..errors import HeteroConfigError


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The stage's parameters its optimizer takes: those its forward uses that require grad.

    A stage module may leave out parameters its forward never uses (families/llava/adapter.py says why).
    """
    if hasattr(module, "trainable_parameters"):
        return module.trainable_parameters()
    return [p for p in module.parameters() if p.requires_grad]


def _stage_names(adapter) -> dict[str, list[str]]:
    """Stage -> the Hugging Face names of its parameters."""
    names = {id(p): n for n, p in adapter.model.named_parameters()}
    return {stage: [names[id(p)] for p in module.parameters() if id(p) in names]
            for stage, module in adapter.split().items()}


def _patterns(adapter, stage: str, entry: str) -> list[str]:
    return list(getattr(adapter, "FREEZE_GROUPS", {}).get(stage, {}).get(entry, [entry]))


def frozen_names(cfg, adapter) -> dict[str, set[str]]:
    """Stage -> the names the config freezes (checked: every entry matches a parameter of its stage)."""
    return names_frozen_by({stage: cfg.options_of(stage).freeze for stage in cfg.stages}, adapter)


def names_frozen_by(freeze: Mapping[str, bool | Sequence[str]], adapter) -> dict[str, set[str]]:
    """Stage -> the names `freeze` (stage -> a `freeze` value) freezes; the planner asks this of a
    user's base config, without a parsed HeteroConfig."""
    out = {}
    for stage, names in _stage_names(adapter).items():
        freeze_ = freeze.get(stage, False)
        if freeze_ is True:
            out[stage] = set(names)
            continue
        out[stage] = set()
        for i, entry in enumerate(freeze_ or ()):
            hit = {n for pattern in _patterns(adapter, stage, entry) for n in fnmatch.filter(names, pattern)}
            if not hit:
                groups = sorted(getattr(adapter, "FREEZE_GROUPS", {}).get(stage, {}))
                raise HeteroConfigError(
                    f"hetero_parallel.stages.{stage}.freeze[{i}]",
                    f"{entry!r} names no parameter of stage {stage!r} of {type(adapter.model).__name__}: give a "
                    f"group ({', '.join(groups) or 'none for this stage'}) or an fnmatch pattern of its Hugging Face "
                    f"parameter names (e.g. {names[0]!r})")
            out[stage] |= hit
    return out


def check_freeze(cfg, adapter) -> None:
    """Every freeze entry names parameters, and some stage still trains (pure: meta models too)."""
    if not any(cfg.options_of(stage).freeze for stage in cfg.stages):
        # nothing frozen by the config (the planner asks this for thousands of layouts): only the
        # model's own requires_grad flags can leave nothing to train
        if any(trainable_parameters(module) for module in adapter.split().values()):
            return
    frozen = frozen_names(cfg, adapter)
    named = dict(adapter.model.named_parameters())
    for stage, module in adapter.split().items():
        mine = {id(named[n]) for n in frozen[stage]}
        if any(id(p) not in mine for p in trainable_parameters(module)):
            return
    raise HeteroConfigError(
        "hetero_parallel.stages", "no stage has a trainable parameter left (the freeze keys and the model's "
        "requires_grad=False flags freeze everything): nothing would train")


def apply_freeze(cfg, adapter) -> None:
    """Set requires_grad=False on the parameters the config freezes (before sharding: the tp
    layers copy the flag onto their shards)."""
    named = dict(adapter.model.named_parameters())
    for names in frozen_names(cfg, adapter).values():
        for n in names:
            named[n].requires_grad_(False)
