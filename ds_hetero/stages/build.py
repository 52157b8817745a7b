"""Building the StageSet: groups, tensor-parallel shards, stage modules, per-shard weights, engines.

In an order every rank follows identically (group creation and `deepspeed.initialize` are
collective): process groups of every stage -> shard each stage over its tp group -> cut the
model into stage modules -> read each held stage's weights shard (if a checkpoint was given)
-> free the modules of stages this rank does not hold -> one `deepspeed.initialize` per held
stage, each with its own StageMPU and batch keys. With a pipelined language stage (pp > 1) a rank
holds one pipeline stage of it (models/pipeline.py): its Stage's module and engine are that
chunk's, its mpu answers for the chunk's tp/cp/dp groups (gradients reduced over the chunk's dp).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch

from ..config import LANGUAGE, HeteroConfig
from ..config.pipeline import layer_cut
from ..models.pipeline import cut_language_stage
from ..topology.groups import build_groups
from ..topology.mpu import StageMPU, stage_context
from ..weights import load_stages
from .clipping import check_supported
from .stage_set import Stage, StageSet


def _trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    # A stage module may leave out parameters its forward never uses (models/llava.py says why).
    if hasattr(module, "trainable_parameters"):
        return module.trainable_parameters()
    return [p for p in module.parameters() if p.requires_grad]


def build_stage_set(model: torch.nn.Module, cfg: HeteroConfig, adapter, rank: int,
                    optimizer: Callable[[list[torch.nn.Parameter]], Any] | None = None,
                    checkpoint=None) -> tuple[StageSet, Any]:
    """(the StageSet of this rank, the weights load report or None)."""
    import deepspeed

    groups = build_groups(cfg.stages, rank, timeout=timedelta(seconds=cfg.timeout_s))
    adapter.shard(groups, cfg)  # per-stage tensor parallelism (checks first, then shards)
    modules = adapter.split()
    held = [name for name, layout in cfg.stages.items() if layout.contains(rank)]
    language = cfg.language
    if language.pp > 1:
        if language.contains(rank):  # this rank's pipeline stage only; the others' layers go to meta
            cut = layer_cut(len(modules[LANGUAGE].language_model.layers), language.pp, cfg.pp_layers)
            modules[LANGUAGE] = cut_language_stage(modules[LANGUAGE], language.coord(rank).pp, language.pp, cut)
    load_report = None if checkpoint is None else load_stages(
        model, {n: modules[n] for n in held}, {n: (groups[n].coord.tp, cfg.stages[n].tp) for n in held}, checkpoint)
    stages = {}
    for name, layout in cfg.stages.items():  # same order on every rank: deepspeed.initialize is collective
        stage = Stage(name, layout, groups[name], modules[name], cfg.micro_batches_of(name))
        if name not in held:  # disaggregated: another rank set holds this stage; free its memory
            modules[name].to("meta")
        else:
            stage.mpu = StageMPU(groups[name])
            with stage_context(stage.mpu):
                stage.engine, *_ = deepspeed.initialize(
                    model=modules[name], model_parameters=_trainable(modules[name]),
                    optimizer=optimizer, mpu=stage.mpu, config=cfg.stage_ds_config(name))
            check_supported(stage.engine, name)
        stages[name] = stage
    first = next(s for s in stages.values() if s.held)
    param = next(first.engine.module.parameters())
    return StageSet(rank, cfg, groups, stages, param.device, param.dtype), load_report
