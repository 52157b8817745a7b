"""Save and load a HeteroEngine checkpoint (HeteroEngine.save_checkpoint / load_checkpoint call these).

On disk:

    DIR/latest                       the tag of the last complete checkpoint (written last)
    DIR/<tag>/manifest.json          manifest.py
    DIR/<tag>/<stage>/params.json    the stage's parameters: full shapes, tp splits, HF names
    DIR/<tag>/<stage>/<tag>/...      the stage engine's own DeepSpeed files (a plain DeepSpeed
                                     checkpoint folder: `zero_to_fp32.py` etc. work on it)
    DIR/<tag>/full_state/<stage>.pt  cache: the stage as full tensors (made by a layout change)

Loading with the layout that saved it is DeepSpeed's own per-engine load (bit-exact resume).
Another layout (tp, dp, placement, ZeRO 0/1/2, dtype) goes through full per-parameter tensors
(full_state.py, reshard.py); what cannot be loaded is refused on every rank before anything
changes, naming the saved and the current layout of every stage.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from ..topology.mpu import stage_context
from . import publish
from .full_state import stage_full_state
from .manifest import (MANIFEST, PARAMS, CheckpointError, build_manifest, data_position, describe_layout, engine_facts,
                       read_manifest, read_stage_params, resolve_tag, same_layout, stage_params, write_json)
from .reshard import apply_full_state


def _agree(engine, problem: str | None, what: str) -> None:
    """Every rank raises if any rank found a problem (one small all-reduce; no rank is left waiting)."""
    flag = torch.tensor([0 if problem is None else engine.rank + 1], dtype=torch.long, device=engine.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=engine.groups.boundary)
    if problem is None and int(flag) > 0:
        problem = f"rank {int(flag) - 1} could not {what} (see its error)"
    if problem is not None:
        raise CheckpointError(problem)


def save_checkpoint(engine, save_dir: str | os.PathLike, tag: str | None = None) -> str:
    """Write DIR/<tag> under a temporary name, then publish it (publish.py); all ranks call it."""
    save_dir = os.fspath(save_dir)
    tag = tag or f"global_step{engine.global_steps}"
    if os.path.isfile(os.path.join(save_dir, "latest")) and resolve_tag(save_dir, None) == tag:  # same on every rank
        raise CheckpointError(f"{os.path.join(save_dir, tag)} is the checkpoint 'latest' names; replacing it in "
                              f"place could leave no loadable checkpoint: pass another tag")
    rank = engine.rank
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        publish.clear_partial(save_dir, tag)
    dist.barrier(group=engine.groups.boundary)
    publish.kill_point("begin", rank)
    partial = publish.partial_dir(save_dir, tag)
    for i, (name, stage_engine) in enumerate(engine.engines.items()):
        with stage_context(engine.mpus[name]):
            stage_engine.save_checkpoint(os.path.join(partial, name), tag=tag, save_latest=False,
                                         client_state={"ds_hetero_global_steps": engine.global_steps})
        if i == 0 and len(engine.engines) > 1:
            publish.kill_point("stage_written", rank)
    problem = None
    try:  # our own files: a failure (disk full, permissions) makes every rank raise, none waits
        for name in engine.engines:
            if rank == engine.config.stages[name].ranks[0]:
                write_json(os.path.join(partial, name, PARAMS), stage_params(engine, name))
        if rank == 0:
            write_json(os.path.join(partial, MANIFEST), build_manifest(engine, tag))
    except OSError as exc:
        problem = f"writing the checkpoint's metadata under {partial}: {exc}"
    publish.kill_point("rank_written", rank)
    _agree(engine, problem, "write the checkpoint")  # also the barrier: every rank has written
    if rank == 0:
        publish.publish(save_dir, tag, rank)
    dist.barrier(group=engine.groups.boundary)
    return tag


def refusal(manifest: dict[str, Any], current: dict[str, Any], ckpt_dir: str, engine) -> str | None:
    """Why this checkpoint cannot be loaded into this engine (None if it can). Pure reads."""
    reasons = []
    if set(manifest["stages"]) != set(current["stages"]):
        reasons.append(f"stages differ: saved {sorted(manifest['stages'])}, current {sorted(current['stages'])}")
    if not same_layout(manifest, current):
        if 3 in (manifest["zero_stage"], current["zero_stage"]):
            reasons.append("ZeRO stage 3 checkpoints are loaded only into the layout that saved them "
                           "(resharding reads and writes ZeRO 0, 1 and 2)")
        current_opt = {type(getattr(e.optimizer, "optimizer", e.optimizer)).__name__ for e in engine.engines.values()}
        if manifest["optimizer"] not in current_opt:
            reasons.append(f"optimizer differs: saved {manifest['optimizer']}, current {sorted(current_opt)[0]}")
    for name, stage_engine in engine.engines.items():  # the stages this rank holds: their parameters match
        if name not in manifest["stages"]:
            continue
        saved = read_stage_params(ckpt_dir, name)["params"]
        here = {}
        for pname, p in stage_engine.module.named_parameters():
            shape = list(getattr(p, "ds_shape", p.shape))  # ZeRO 3 keeps only a partition in p
            if getattr(p, "tensor_model_parallel", False) and current["stages"][name]["tp"] > 1:
                shape[p.partition_dim] = p.partition_full_size
            here[pname] = shape
        if set(saved) != set(here):
            missing, extra = sorted(set(saved) - set(here)), sorted(set(here) - set(saved))
            reasons.append(f"stage {name}: not the same model (saved only: {missing[:3]}, current only: {extra[:3]})")
        else:
            bad = [n for n in here if here[n] != saved[n]["shape"]]
            if bad:
                reasons.append(f"stage {name}: not the same model ({bad[0]}: saved {saved[bad[0]]['shape']}, "
                               f"current {here[bad[0]]})")
    if not reasons:
        return None
    layouts = "\n".join(f"  {s}: saved {describe_layout(manifest, s)}; current {describe_layout(current, s)}"
                        for s in sorted(set(manifest["stages"]) | set(current["stages"])))
    return f"checkpoint {ckpt_dir} cannot be loaded into this layout: {'; '.join(reasons)}\n{layouts}"


def load_checkpoint(engine, load_dir: str | os.PathLike, tag: str | None = None) -> str:
    """Load DIR (its `latest`, or `tag`) into `engine`, whatever layout saved it; all ranks call it."""
    load_dir = os.fspath(load_dir)
    problem, manifest = None, None
    try:
        tag = resolve_tag(load_dir, tag)
        manifest = read_manifest(load_dir, tag)
        ckpt_dir = os.path.join(load_dir, tag)
        problem = refusal(manifest, engine_facts(engine), ckpt_dir, engine)
    except (OSError, ValueError, KeyError) as exc:
        problem = f"{type(exc).__name__}: {exc}" if isinstance(exc, KeyError) else str(exc)
    _agree(engine, problem, "read the checkpoint")

    if same_layout(manifest, engine_facts(engine)):
        for name, stage_engine in engine.engines.items():
            with stage_context(engine.mpus[name]):
                path, _ = stage_engine.load_checkpoint(os.path.join(ckpt_dir, name), tag=tag)
            if path is None:
                raise CheckpointError(f"DeepSpeed found no checkpoint in {os.path.join(ckpt_dir, name, tag)}")
    else:
        _convert(engine, ckpt_dir, manifest)
        for name, stage_engine in engine.engines.items():
            layout = engine.config.stages[name]
            state = stage_full_state(ckpt_dir, name, manifest)
            with stage_context(engine.mpus[name]):
                apply_full_state(stage_engine, dict(stage_engine.module.named_parameters()), state,
                                 engine.coords[name].tp, layout.tp, _current_zero(engine))
    engine.global_steps = manifest["step"]  # the loader's position: its order is a function of (seed, step)
    _warn_if_data_differs(engine, manifest["data"])
    dist.barrier(group=engine.groups.boundary)
    return tag


def _warn_if_data_differs(engine, saved: dict[str, Any]) -> None:
    """Resuming at the saved step continues the same data order only with the same data and batch."""
    import warnings

    current = data_position(engine)
    keys = [k for k in ("global_batch_size", "seed", "dataset_size", "shuffle") if k in saved and k in current]
    changed = [f"{k} {saved[k]} -> {current[k]}" for k in keys if saved[k] != current[k]]
    if changed and engine.rank == 0:
        warnings.warn(f"ds_hetero: resuming at step {saved['global_steps']} with other data settings "
                      f"({', '.join(changed)}): the data order does not continue the saved run's", stacklevel=3)


def _current_zero(engine) -> int:
    return engine_facts(engine)["zero_stage"]


def _convert(engine, ckpt_dir: str, manifest: dict[str, Any]) -> None:
    """The first rank of each stage writes the stage's full-state cache once; the others wait for it."""
    problem = None
    for name, layout in engine.config.stages.items():
        if engine.rank == layout.ranks[0]:
            try:
                stage_full_state(ckpt_dir, name, manifest)
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                problem = f"converting stage {name} of {ckpt_dir}: {type(exc).__name__}: {exc}"
    _agree(engine, problem, "convert the checkpoint")
