"""Save and load a HeteroEngine checkpoint (HeteroEngine.save_checkpoint / load_checkpoint call these).

On disk:

    DIR/latest                       the tag of the last complete checkpoint (written last)
    DIR/<tag>/manifest.json          manifest.py
    DIR/<tag>/<stage>/params.json    the stage's parameters: full shapes, tp splits, HF names
    DIR/<tag>/<stage>/<tag>/...      the stage engine's own DeepSpeed files (a plain DeepSpeed
                                     checkpoint folder: `zero_to_fp32.py` etc. work on it)
    DIR/<tag>/<stage>/pp_<k>/...     a pipelined stage: params.json and DeepSpeed files per chunk
                                     (layer_map.py)
    DIR/<tag>/full_state/<stage>.hf.pt  cache: the stage as full tensors (made by a layout change)

Loading with the layout that saved it is DeepSpeed's own per-engine load (bit-exact resume).
Another layout (tp, dp, pp and the layer cut, placement, ZeRO 0/1/2, dtype) goes through full
per-parameter tensors keyed by the model's names (full_state.py, reshard.py); what cannot be loaded is refused on every rank before anything
changes, naming the saved and the current layout of every stage.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from . import publish
from .expert_state import save_expert_stage
from .stage_collectives import collectives_on
from .full_state import saved_metas, stage_full_state
from .layer_map import hf_names, stage_dir
from .manifest import (MANIFEST, PARAMS, CheckpointError, build_manifest, deepspeed_load_applies, describe_layout,
                       engine_facts, ep_of, full_shape, read_manifest, resolve_tag, same_layout, saved_stage_zero,
                       stage_params, write_json)
from .reshard import apply_full_state


def _agree(stages, problem: str | None, what: str) -> None:
    """Every rank raises if any rank found a problem (one small all-reduce; no rank is left waiting)."""
    flag = torch.tensor([0 if problem is None else stages.rank + 1], dtype=torch.long, device=stages.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=stages.boundary_group)
    if problem is None and int(flag) > 0:
        problem = f"rank {int(flag) - 1} could not {what} (see its error)"
    if problem is not None:
        raise CheckpointError(problem)


def save_checkpoint(stages, model, save_dir: str | os.PathLike, tag: str | None, step: int,
                    data: dict[str, Any]) -> str:
    """Write DIR/<tag> under a temporary name, then publish it (publish.py); all ranks call it.

    `step` is the optimizer steps taken, `data` the loader's position (manifest.data_position).
    """
    save_dir = os.fspath(save_dir)
    tag = tag or f"global_step{step}"
    if os.path.isfile(os.path.join(save_dir, "latest")) and resolve_tag(save_dir, None) == tag:  # same on every rank
        raise CheckpointError(f"{os.path.join(save_dir, tag)} is the checkpoint 'latest' names; replacing it in "
                              f"place could leave no loadable checkpoint: pass another tag")
    rank = stages.rank
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        publish.clear_partial(save_dir, tag)
    dist.barrier(group=stages.boundary_group)
    publish.kill_point("begin", rank)
    partial = publish.partial_dir(save_dir, tag)
    held = stages.held
    for i, stage in enumerate(held):
        with stage.context():
            if stage.layout.ep > 1:  # experts sharded over ep: ds_hetero's own files (expert_state.py)
                save_expert_stage(stage, model, stage_dir(partial, stage))
            elif not stage.owns_engine:  # a shared engine's files go to its owner's folder, once
                os.makedirs(stage_dir(partial, stage), exist_ok=True)
            else:  # DeepSpeed's world collectives on this stage's ranks (stage_collectives.py)
                with collectives_on(stage.groups.stage):
                    stage.engine.save_checkpoint(stage_dir(partial, stage), tag=tag, save_latest=False,
                                                 client_state={"ds_hetero_global_steps": step})
        if i == 0 and len(held) > 1:
            publish.kill_point("stage_written", rank)
    problem = None
    try:  # our own files: a failure (disk full, permissions) makes every rank raise, none waits
        for stage in held:
            if rank == stage.norm_rank:  # the stage's first rank, or its pipeline chunk's
                write_json(os.path.join(stage_dir(partial, stage), PARAMS), stage_params(stage, model))
        if rank == 0:
            write_json(os.path.join(partial, MANIFEST), build_manifest(stages, model, tag, step, data))
    except OSError as exc:
        problem = f"writing the checkpoint's metadata under {partial}: {exc}"
    publish.kill_point("rank_written", rank)
    _agree(stages, problem, "write the checkpoint")  # also the barrier: every rank has written
    if rank == 0:
        publish.publish(save_dir, tag, rank)
    dist.barrier(group=stages.boundary_group)
    return tag


def zero3_not_resharded(manifest: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The stages a layout change cannot move: ZeRO 3 on either side, in DeepSpeed's own files (read
    only by DeepSpeed's load into the same layout). A stage with experts over ep saves and loads
    ds_hetero's own files under any ZeRO stage (expert_state.py, zero3_state.py)."""
    return [s for s in current["stages"] if s in manifest["stages"]
            and any(saved_stage_zero(f, s) == 3 and ep_of(f, s) == 1 for f in (manifest, current))]


def refusal(manifest: dict[str, Any], current: dict[str, Any], ckpt_dir: str, stages, model) -> str | None:
    """Why this checkpoint cannot be loaded into these stages (None if it can). Pure reads."""
    reasons = []
    if set(manifest["stages"]) != set(current["stages"]):
        reasons.append(f"stages differ: saved {sorted(manifest['stages'])}, current {sorted(current['stages'])}")
    if not same_layout(manifest, current):
        zero3 = zero3_not_resharded(manifest, current)
        if zero3:
            reasons.append(f"stage {zero3[0]}: ZeRO stage 3 checkpoints are loaded only into the layout that saved "
                           "them (resharding reads and writes ZeRO 0, 1 and 2, and ZeRO 3 only for a stage "
                           "with experts over ep)")
        current_opt = {stage.optimizer_name for stage in stages.held if stage.trains}
        if current_opt and manifest["optimizer"] is not None and manifest["optimizer"] not in current_opt:
            reasons.append(f"optimizer differs: saved {manifest['optimizer']}, current {sorted(current_opt)[0]}")
    model_names = {n for n, _ in model.named_parameters()}
    for stage in stages.held:  # the stages this rank holds: their parameters match, by the model's names
        name = stage.name
        if name not in manifest["stages"]:
            continue
        try:  # every chunk's params.json, its layer map checked against the saved cut
            saved = {info["hf_name"]: info["shape"] for meta in saved_metas(ckpt_dir, name, manifest)
                     for info in meta["params"].values()}
        except CheckpointError as exc:
            reasons.append(f"stage {name}: {exc}")
            continue
        here = {}
        to_hf = hf_names(stage.module, model)
        for pname, p in stage.module.named_parameters():
            here[to_hf[pname]] = full_shape(p, current["stages"][name]["tp"])
        # a pipeline chunk holds a part of the stage: its names are among the saved ones, and the
        # saved ones among the model's (every rank checks its chunk, so together they cover the stage)
        missing = sorted(set(saved) - set(here)) if not stage.pipeline else sorted(set(saved) - model_names)
        extra = sorted(set(here) - set(saved))
        if missing or extra:
            reasons.append(f"stage {name}: not the same model (saved only: {missing[:3]}, current only: {extra[:3]})")
        else:
            bad = [n for n in here if here[n] != saved[n]]
            if bad:
                reasons.append(f"stage {name}: not the same model ({bad[0]}: saved {saved[bad[0]]}, "
                               f"current {here[bad[0]]})")
    if not reasons:
        return None
    layouts = "\n".join(f"  {s}: saved {describe_layout(manifest, s)}; current {describe_layout(current, s)}"
                        for s in sorted(set(manifest["stages"]) | set(current["stages"])))
    return f"checkpoint {ckpt_dir} cannot be loaded into this layout: {'; '.join(reasons)}\n{layouts}"


def load_checkpoint(stages, load_dir: str | os.PathLike, tag: str | None, data: dict[str, Any],
                    model) -> tuple[str, int]:
    """Load DIR (its `latest`, or `tag`) into the stages, whatever layout saved it; all ranks call it.

    Returns (the tag, the saved step). `data` is the current loader's position: a warning says
    when resuming with other data settings would not continue the saved run's data order.
    """
    load_dir = os.fspath(load_dir)
    problem, manifest = None, None
    facts = engine_facts(stages)
    try:
        tag = resolve_tag(load_dir, tag)
        manifest = read_manifest(load_dir, tag)
        ckpt_dir = os.path.join(load_dir, tag)
        problem = refusal(manifest, facts, ckpt_dir, stages, model)
    except (OSError, ValueError, KeyError) as exc:
        problem = f"{type(exc).__name__}: {exc}" if isinstance(exc, KeyError) else str(exc)
    _agree(stages, problem, "read the checkpoint")

    if deepspeed_load_applies(manifest, facts):
        for stage in stages.held:
            if not stage.owns_engine:  # a shared engine loads once, from its owner's folder
                continue
            with stage.context():
                path, _ = stage.engine.load_checkpoint(stage_dir(ckpt_dir, stage), tag=tag)
            if path is None:
                raise CheckpointError(f"DeepSpeed found no checkpoint in {os.path.join(stage_dir(ckpt_dir, stage), tag)}")
    else:
        _convert(stages, ckpt_dir, manifest)
        for stage in stages.held:
            state = stage_full_state(ckpt_dir, stage.name, manifest)
            to_hf = hf_names(stage.module, model)  # the cache is keyed by the model's names
            with stage.context():  # a shared engine: each stage sets its own parameters in it
                apply_full_state(stage.engine, {to_hf[n]: p for n, p in stage.module.named_parameters()}, state,
                                 stage.coord.tp, stage.layout.tp, saved_stage_zero(facts, stage.name))
    _warn_if_data_differs(stages.rank, manifest["data"], data)
    dist.barrier(group=stages.boundary_group)
    return tag, manifest["step"]


def _warn_if_data_differs(rank: int, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Resuming at the saved step continues the same data order only with the same data and batch."""
    import warnings

    keys = [k for k in ("global_batch_size", "seed", "dataset_size", "shuffle") if k in saved and k in current]
    changed = [f"{k} {saved[k]} -> {current[k]}" for k in keys if saved[k] != current[k]]
    if changed and rank == 0:
        warnings.warn(f"ds_hetero: resuming at step {saved['global_steps']} with other data settings "
                      f"({', '.join(changed)}): the data order does not continue the saved run's", stacklevel=3)


def _convert(stages, ckpt_dir: str, manifest: dict[str, Any]) -> None:
    """The first rank of each stage writes the stage's full-state cache once; the others wait for it."""
    problem = None
    for stage in stages:
        if stages.rank == stage.first_rank:
            try:
                stage_full_state(ckpt_dir, stage.name, manifest)
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                problem = f"converting stage {stage.name} of {ckpt_dir}: {type(exc).__name__}: {exc}"
    _agree(stages, problem, "convert the checkpoint")
