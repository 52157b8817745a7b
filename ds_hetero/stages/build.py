"""Building the StageSet: groups, tensor-parallel shards, stage modules, per-shard weights, engines.

In an order every rank follows identically (group creation and `deepspeed.initialize` are
collective): process groups of every stage -> rank 0's initial weights on every rank
(equal_replicas.py; not with a checkpoint, which every rank reads alike) -> shard each stage over its tp group -> cut the
model into stage modules -> read each held stage's weights shard (if a checkpoint was given)
-> free the modules of stages this rank does not hold -> one `deepspeed.initialize` per held
stage, each with its own StageMPU and batch keys (stages on the same ranks in the same layout,
ZeRO 0/1: one engine for all of them, shared_engine.py). With a pipelined language stage (pp > 1) a rank
holds one pipeline stage of it (pipeline_parallel/chunk.py): its Stage's module and engine are that
chunk's, its mpu answers for the chunk's tp/cp/dp groups (gradients reduced over the chunk's dp).

Frozen parameters (`stages.<name>.freeze`, or `requires_grad=False` set by the user) are marked
before sharding (models/freeze.py); a stage with none left to train gets an engine without an
optimizer (HeteroConfig.stage_ds_config). Recompute is switched on per stage after the cut
(models/recompute.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch

from ..config import LANGUAGE, HeteroConfig
from ..expert_parallel.zero import expert_param_groups
from ..pipeline_parallel.cut import layer_cut
from ..models.freeze import apply_freeze, trainable_parameters
from ..pipeline_parallel.chunk import cut_language_stage
from ..models.recompute import enable_recompute
from ..reporting.startup import PhaseClock
from ..tensor_parallel.lora_dropout import stage_rng
from ..tensor_parallel.shard import is_tied
from ..topology.groups import build_groups
from ..topology.mpu import StageMPU, stage_context
from ..weights import load_stages
from .equal_replicas import equalize_replicas
from .shared_engine import SharedStages, shared_ds_config, sharing_stages
from .stage_set import Stage, StageSet
from .tied_embeddings import param_groups, tied_copy
from ..pipeline_parallel.zero3 import confine_trace_check
from ..context_parallel.zero3 import correct_sequence_average, partition_over_sequence_shards


def build_stage_set(model: torch.nn.Module, cfg: HeteroConfig, adapter, rank: int,
                    optimizer: Callable[[list[torch.nn.Parameter]], Any] | None = None,
                    checkpoint=None, seed: int = 0) -> tuple[StageSet, Any]:
    """(the StageSet of this rank, the weights load report or None). `seed` (the same on every rank)
    seeds each stage's model-parallel dropout streams (tensor_parallel/rng.py)."""
    import deepspeed
    from deepspeed.moe.utils import is_moe_param

    clock = PhaseClock()  # startup lines (reporting/startup.py), printed where an entry point shows them
    groups = build_groups(cfg.stages, rank, timeout=timedelta(seconds=cfg.timeout_s))
    clock.done("process groups of every stage built")
    if checkpoint is None:  # before the split and the tp cut: every rank still holds the whole model
        start_equal(model, groups)
    apply_freeze(cfg, adapter)  # before sharding: the tp shards copy requires_grad
    adapter.shard(groups, cfg)  # per-stage tensor parallelism (checks first, then shards)
    modules = adapter.split()
    held = [name for name, layout in cfg.stages.items() if layout.contains(rank)]
    # LoRA dropout on tp-sharded layers draws from its stage's own RNG (no communication)
    rngs = {name: stage_rng(modules[name], name, groups[name].coord, seed) for name in held}
    language = cfg.language
    tied = is_tied(model)  # before the cut: on the full model, the same on every rank
    if language.pp > 1:
        if language.contains(rank):  # this rank's pipeline stage only; the others' layers go to meta
            cut = layer_cut(len(modules[LANGUAGE].language_model.layers), language.pp, cfg.pp_layers)
            modules[LANGUAGE] = cut_language_stage(modules[LANGUAGE], language.coord(rank).pp, language.pp, cut)
    load_report = None if checkpoint is None else load_stages(
        model, {n: modules[n] for n in held}, {n: (groups[n].coord.tp, cfg.stages[n].tp) for n in held}, checkpoint)
    clock.done("model cut into stages and tp shards" + (", weights read" if checkpoint is not None else ""))
    # a tied embedding with pp > 1: one copy on the first pipeline stage, one on the last (after the
    # load, which replaces parameter objects; collective: every rank builds the embedding group)
    copy = tied_copy(language, rank, groups.cache, modules[LANGUAGE] if language.contains(rank) else None, tied)
    stages = {}
    shared = sharing_stages(cfg, {n: trainable_parameters(modules[n]) for n in cfg.stages}, held,
                            has_experts=any(is_moe_param(p) for p in modules[LANGUAGE].parameters()))
    shared_engine = None
    for name, layout in cfg.stages.items():  # same order on every rank: deepspeed.initialize is collective
        trainable = trainable_parameters(modules[name])  # the same on every rank: flags set before any rank differs
        stage = Stage(name, layout, groups[name], modules[name], cfg.micro_batches_of(name), trains=bool(trainable),
                      rng=rngs.get(name))
        if cfg.options_of(name).recompute:
            enable_recompute(modules[name], cfg.options_of(name).recompute, rng=stage.rng)
        if name not in held:  # disaggregated: another rank set holds this stage; free its memory
            modules[name].to("meta")
        elif name in shared:  # one engine over all of them, built at the first (collective, in config order)
            stage.mpu, stage.engine_owner = StageMPU(groups[name]), shared[0]
            if shared_engine is None:
                with stage_context(stage.mpu):
                    shared_engine, *_ = deepspeed.initialize(
                        model=SharedStages({n: modules[n] for n in shared}),
                        # a param group per stage: ZeRO 1 flattens per group, so a stage with
                        # no work in a step can be left unstepped (optimizer_step/idle_stages.py)
                        model_parameters=[{"params": trainable_parameters(modules[n])} for n in shared],
                        optimizer=optimizer, mpu=stage.mpu, config=shared_ds_config(cfg, shared))
            stage.engine = shared_engine
        else:
            stage.mpu = StageMPU(groups[name])
            ds_config = cfg.stage_ds_config(name, trains=stage.trains)
            with stage_context(stage.mpu):
                partition_over_sequence_shards(modules[name], groups[name], stage.mpu, ds_config, layout.cp)
                params = param_groups(trainable, copy) if name == LANGUAGE else trainable
                if name == LANGUAGE and stage.trains:  # experts: their own (MoE) optimizer groups
                    params = expert_param_groups(params, modules[name], cfg.zero_stage_of(name))
                stage.engine, *_ = deepspeed.initialize(
                    model=modules[name], model_parameters=params if stage.trains else None,
                    optimizer=optimizer if stage.trains else None, mpu=stage.mpu, config=ds_config)
            if stage.trains:
                correct_sequence_average(stage.engine, layout.cp)
            if language.pp > 1:  # ZeRO 3: each engine's trace check over its own ranks, not the world
                confine_trace_check(stage.engine, groups[name].dp_cp)
        stage.tied = copy if name == LANGUAGE else None
        stages[name] = stage
        if name in held:
            owner = stage.engine_owner
            clock.done(f"{name}: DeepSpeed engine " + (f"shared with {owner}" if owner not in (None, name) else "built"))
    first = next(s for s in stages.values() if s.held)
    param = next(first.engine.module.parameters())
    return StageSet(rank, cfg, groups, stages, param.device, param.dtype), load_report


def start_equal(model: torch.nn.Module, groups) -> None:
    """Rank 0's parameters and buffers on every rank (stages/equal_replicas.py), staged on the
    device the engines will train on; a warning on a rank that had built other values."""
    import warnings

    from deepspeed.accelerator import get_accelerator

    src = groups.boundary_ranks[0]
    differed = equalize_replicas(model, groups.boundary, src, get_accelerator().current_device_name())
    if differed:
        warnings.warn(f"ds_hetero: this rank built other initial values than rank {src} for {len(differed)} "
                      f"parameters and buffers (first: {differed[0]}); every rank now trains rank {src}'s "
                      "model, as DeepSpeed does (per-rank seeds or freshly initialized modules)", stacklevel=3)
