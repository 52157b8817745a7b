"""What a checkpoint records, in `DIR/<tag>/manifest.json` (small, human-readable JSON).

    format        "ds_hetero.checkpoint/1"
    tag, step     the tag and HeteroEngine.global_steps at the save
    data          the loader's position: steps taken, samples consumed, seed, epoch and step in
                  the epoch; resuming at `step` continues the same data order (the loader's
                  order is a pure function of (seed, step))
    placement, world_size, zero_stage, dtype, optimizer
    stages        per stage: tp, cp, dp, ranks, sequence_parallel, zero_stage; pp and pp_layers
                  (the layers of each pipeline chunk, as cut) for a pipelined stage; ep (experts
                  sharded over ep ranks: the stage's files are expert_state.py's); engine: the
                  stage whose folder holds its engine's DeepSpeed files (itself, or the first of
                  the stages sharing one engine, stages/shared_engine.py)
    model         the Hugging Face class and config (for `ds-hetero checkpoint convert --to-hf`)
    versions      ds_hetero, deepspeed, torch, transformers

Each stage folder also holds `params.json`, written by the stage's first rank (in disaggregated
placement rank 0 does not hold every stage): every parameter's full shape, its tp split (dim,
stride) and Hugging Face name, and the optimizer's parameter order (ZeRO 0 files index by it); an
expert weight sharded over ep has its full shape (all experts) and `"ep_split": {"dim", "outer"}` (where
its experts are: expert_parallel/gather.py; {"dim": 0, "outer": 1} for the fused expert weights).
A tied weight's copy on the last pipeline stage (stages/tied_embeddings.py) is recorded under the
model's one name with `"shared_copy": true`: the full state takes that name from the first chunk.
A pipelined stage has one folder per chunk, each with its params.json (layer_map.py). Stages that
share one engine each have their params.json, naming their parameters as the engine's files do.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..stages.shared_engine import engine_names
from ..stages.tied_embeddings import is_shared_copy
from .layer_map import chunk_record, current_counts

FORMAT = "ds_hetero.checkpoint/1"
MANIFEST = "manifest.json"
PARAMS = "params.json"
LAYOUT_KEYS = ("tp", "cp", "dp", "ranks", "sequence_parallel")
PIPELINE_DEFAULTS = {"pp": 1, "pp_layers": None}  # what a manifest without these keys was saved with
EP_DEFAULT = 1  # a manifest without "ep" was saved without expert parallelism


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded here; raised on every rank before anything changes."""


def versions() -> dict[str, str]:
    import deepspeed
    import torch
    import transformers

    from ..version import __version__ as ds_hetero_version

    return {"ds_hetero": ds_hetero_version, "deepspeed": deepspeed.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__}


def zero_stage(ds_config: dict[str, Any]) -> int:
    section = ds_config.get("zero_optimization")
    return int(section.get("stage", 0)) if isinstance(section, dict) else 0


def stage_zero(stages, name: str) -> int:
    """The ZeRO stage `name`'s engine runs (HeteroConfig.stage_ds_config)."""
    return stages.config.zero_stage_of(name) if stages[name].trains else 0


def saved_stage_zero(manifest: dict[str, Any], stage: str) -> int:
    """The ZeRO stage a checkpoint's stage was saved with (older manifests: one for all stages)."""
    return manifest["stages"][stage].get("zero_stage", manifest["zero_stage"])


def engine_facts(stages) -> dict[str, Any]:
    """The facts of the running engine a checkpoint is compared against (the same on every rank)."""
    cfg = stages.config
    return {
        "placement": cfg.placement,
        "world_size": cfg.world_size,
        "zero_stage": zero_stage(cfg.ds_config),
        "dtype": str(stages.dtype).replace("torch.", ""),
        "stages": {name: {"tp": l.tp, "cp": l.cp, "dp": l.dp, "ranks": list(l.ranks),
                          "sequence_parallel": l.sequence_parallel,
                          # each stage's own: stages.<name>.zero_stage, and 0 for a stage that trains nothing
                          "zero_stage": stage_zero(stages, name),
                          "pp": l.pp, "pp_layers": current_counts(stages, name), "ep": l.ep,
                          "engine": stages[name].engine_owner or name}
                   for name, l in cfg.stages.items()},
    }


def data_position(step: int, global_batch_size: int, loader=None) -> dict[str, Any]:
    """Where the loader stands: its order is a pure function of (seed, step), so the step suffices."""
    position = {"global_steps": step, "samples_consumed": step * global_batch_size,
                "global_batch_size": global_batch_size}
    if loader is not None:
        per_epoch = getattr(loader, "steps_per_epoch", None)
        position.update(seed=getattr(loader, "seed", None), shuffle=getattr(loader, "shuffle", None),
                        dataset_size=len(loader.dataset))
        if per_epoch:
            position.update(epoch=step // per_epoch, step_in_epoch=step % per_epoch)
    return position


def build_manifest(stages, model, tag: str, step: int, data: dict[str, Any]) -> dict[str, Any]:
    optimizers = {stage.optimizer_name for stage in stages.held if stage.trains}
    return {
        "format": FORMAT,
        "tag": tag,
        "step": step,
        "data": data,
        **engine_facts(stages),
        "optimizer": (sorted(optimizers) or [None])[0],  # None: this rank holds frozen stages only
        "model": {"class": type(model).__name__, "config": json.loads(model.config.to_json_string())},
        "versions": versions(),
    }


def engine_of(facts: dict[str, Any], stage: str) -> str:
    """The stage whose folder holds `stage`'s DeepSpeed files (older manifests: its own)."""
    return facts["stages"].get(stage, {}).get("engine", stage)


def stage_params(stage, model) -> dict[str, Any]:
    """params.json of one stage, from a rank that holds it: full shapes, tp splits, HF names; each
    parameter under its name in the engine's files (a shared engine's: `stages.<stage>.` first)."""
    hf_names = {id(p): n for n, p in model.named_parameters()}
    names = engine_names(stage)
    params = {}
    for p in stage.module.parameters():
        name = names[id(p)]
        shape = full_shape(p, stage.layout.tp)
        split = None
        if getattr(p, "tensor_model_parallel", False) and stage.layout.tp > 1:
            split = {"dim": p.partition_dim, "stride": p.partition_stride}
        params[name] = {"shape": shape, "tp_split": split, "hf_name": hf_names.get(id(p), name),
                        "trainable": p.requires_grad}
        if getattr(p, "expert_parallel", False):  # this rank holds E / ep of the experts (expert_parallel/gather.py)
            params[name]["ep_split"] = {"dim": p.ep_dim, "outer": p.ep_outer}
        if is_shared_copy(p):  # a tied weight's copy on the last pipeline stage: the first chunk's is saved
            params[name]["shared_copy"] = True
    optimizer = stage.engine.optimizer  # ZeRO 0's files index its state by the engine's whole order
    order = []
    if hasattr(optimizer, "param_groups") and not hasattr(optimizer, "bit16_groups"):
        order = [names[id(p)] for g in optimizer.param_groups for p in g["params"] if id(p) in names]
    return {"params": params, "optimizer_order": order, "chunk": chunk_record(stage)}


def full_shape(p, tp: int) -> list[int]:
    """A live parameter's full shape: over ZeRO 3's partition, tp's split and ep's experts."""
    shape = list(getattr(p, "ds_shape", p.shape))  # ZeRO 3 keeps only a partition in p
    if getattr(p, "tensor_model_parallel", False) and tp > 1:
        shape[p.partition_dim] = p.partition_full_size
    if getattr(p, "expert_parallel", False):
        shape[p.ep_dim] *= p.ep_size
    return shape


def write_json(path: str, data: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def resolve_tag(load_dir: str, tag: str | None) -> str:
    if tag is not None:
        return tag
    path = os.path.join(load_dir, "latest")
    if not os.path.isfile(path):
        raise CheckpointError(f"{load_dir}: no 'latest' file; no checkpoint was published here "
                              f"(pass tag= to load a specific one)")
    with open(path) as f:
        return f.read().strip()


def read_manifest(load_dir: str | os.PathLike, tag: str | None = None) -> dict[str, Any]:
    load_dir = os.fspath(load_dir)
    tag = resolve_tag(load_dir, tag)
    path = os.path.join(load_dir, tag, MANIFEST)
    if not os.path.isfile(path):
        raise CheckpointError(f"{os.path.join(load_dir, tag)}: no {MANIFEST}; not a ds_hetero checkpoint of this "
                              f"format (or an unfinished save)")
    with open(path) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def read_stage_params(ckpt_dir: str, stage: str, part: str | None = None) -> dict[str, Any]:
    """params.json of a stage, or of its pipeline chunk folder `part` (layer_map.part_dirs)."""
    with open(os.path.join(part or os.path.join(ckpt_dir, stage), PARAMS)) as f:
        return json.load(f)


def pipeline_of(facts: dict[str, Any], stage: str) -> dict[str, Any]:
    """{"pp", "pp_layers"} of a stage in a manifest or the running engine's facts."""
    l = facts["stages"].get(stage, {})
    return {k: l.get(k, d) for k, d in PIPELINE_DEFAULTS.items()}


def ep_of(facts: dict[str, Any], stage: str) -> int:
    """The ep size of a stage in a manifest or the running engine's facts (1 without experts sharded)."""
    return int(facts["stages"].get(stage, {}).get("ep", EP_DEFAULT))


def describe_layout(facts: dict[str, Any], stage: str) -> str:
    l = facts["stages"].get(stage)
    if l is None:
        return "absent"
    pipe = pipeline_of(facts, stage)
    pp = f" pp{pipe['pp']} layers {pipe['pp_layers']}" if pipe["pp"] > 1 else ""
    pp += f" ep{ep_of(facts, stage)}" if ep_of(facts, stage) > 1 else ""
    return (f"tp{l['tp']} cp{l['cp']} dp{l['dp']}{pp} ranks {l['ranks']}, {facts['placement']}, "
            f"ZeRO {saved_stage_zero(facts, stage)}, {facts['dtype']}")


def same_layout(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether DeepSpeed's own per-engine load applies (every rank keeps its files' shard)."""
    keys = ("placement", "world_size", "zero_stage", "dtype")
    same_zero = all(s in saved["stages"] and saved_stage_zero(saved, s) == saved_stage_zero(current, s)
                    for s in current["stages"])
    return all(saved[k] == current[k] for k in keys) and same_zero and all(
        {k: saved["stages"].get(s, {}).get(k) for k in LAYOUT_KEYS} == {k: l[k] for k in LAYOUT_KEYS}
        and pipeline_of(saved, s) == pipeline_of(current, s) and ep_of(saved, s) == ep_of(current, s)
        and engine_of(saved, s) == engine_of(current, s)
        for s, l in current["stages"].items())


def deepspeed_load_applies(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether every stage loads its own DeepSpeed files: the same layout, and no stage with experts
    sharded over ep (whose files are ds_hetero's own, expert_state.py, read through the full state)."""
    return same_layout(saved, current) and all(ep_of(f, s) == 1 for f in (saved, current) for s in f["stages"])


def format_manifest(manifest: dict[str, Any]) -> str:
    """`ds-hetero checkpoint info`: the manifest, readable, then the raw JSON without the model config."""
    lines = [f"checkpoint {manifest['tag']}  step {manifest['step']}  ({manifest['format']})",
             f"placement {manifest['placement']}, world size {manifest['world_size']}, ZeRO {manifest['zero_stage']}, "
             f"{manifest['dtype']}, optimizer {manifest['optimizer']}",
             "stages:"]
    for name, l in manifest["stages"].items():
        pipe = pipeline_of(manifest, name)
        pp = f" pp{pipe['pp']} layers {pipe['pp_layers']}" if pipe["pp"] > 1 else ""
        pp += f" ep{ep_of(manifest, name)}" if ep_of(manifest, name) > 1 else ""
        lines.append(f"  {name:<9} tp{l['tp']} cp{l['cp']} dp{l['dp']}{pp} ranks {l['ranks']} "
                     f"ZeRO {saved_stage_zero(manifest, name)}"
                     + (" sequence-parallel" if l["sequence_parallel"] else "")
                     + (f" (one engine with {engine_of(manifest, name)}: its files in {engine_of(manifest, name)}/)"
                        if engine_of(manifest, name) != name else ""))
    d = manifest["data"]
    lines.append("data: " + ", ".join(f"{k} {v}" for k, v in d.items()))
    lines.append(f"model: {manifest['model']['class']}")
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in manifest["versions"].items()))
    return "\n".join(lines)
