"""A stage's DeepSpeed checkpoint files, of any tp, dp and ZeRO stage 0/1/2, as full tensors
(a stage with experts sharded over ep: ds_hetero's own files, expert_state.py).

    state = stage_full_state(ckpt_dir, "language", manifest)   # cached in ckpt_dir/full_state/
    state["params"][hf_name] = {"fp32": full tensor, "exp_avg": ..., "exp_avg_sq": ...}

Keyed by the model's own (Hugging Face) parameter names, not the stage module's: a pipelined
stage is saved as one set of files per chunk, each naming its layers locally; merged under the
model's names (layer_map.py) they load into any cut, or none.
    state["step"], state["lr_scheduler"], state["global_steps"], state["global_samples"], ...
    state["param_steps"][hf_name]   # each parameter's optimizer step count (a stage left without
                                    # work in some steps is behind the others: optimizer_step/idle_stages.py)

Why not DeepSpeed's Universal Checkpointing (`ds_to_universal` + `"load_universal": true`),
which does the same two merges: (1) a ZeRO-0 checkpoint has no `*_optim_states.pt` files (the
optimizer state sits in `mp_rank_*_model_states.pt`), and DeepSpeed loads a universal checkpoint
only into a ZeRO / BF16 optimizer, so ZeRO 0 on either side of a conversion is outside it; (2)
its tp merge reads regex patterns (row-parallel, replicated, vocabulary) and reslices on load
with the Megatron-style loader that is not aware of our fused, strided shards (Qwen2-VL's qkv,
`partition_stride` 3) and takes the tp rank from the process-global mpu; our parameters carry
exact shard metadata (dim, stride, full size), recorded in params.json. So: the ZeRO merge
reads the same fields ds_to_universal reads (`param_slice_mappings`, the flat fp32 partitions,
the base optimizer state), the tp merge uses our metadata (`merge_shards`, the inverse of the
split every layer does), and the re-split goes through DeepSpeed's public
`safe_set_full_fp32_param` / `safe_set_full_optimizer_state` (reshard.py).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import torch

from ..tensor_parallel.layers import merge_shards
from .expert_state import read_expert_stage
from .layer_map import check_layer_map, part_dirs, saved_entries, saved_pp
from .manifest import CheckpointError, engine_of, ep_of, pipeline_of, read_stage_params, saved_stage_zero

CACHE = "full_state"
CACHE_FILE = "{}.hf.pt"  # keyed by the model's names (an older cache, keyed by module names, is not read)
MOMENTS = ("exp_avg", "exp_avg_sq")


def _load(path: str) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


def _tp_slices(stage_dir: str, meta: dict[str, Any], zero: int, tp: int) -> tuple[list[dict], dict]:
    """Per tp rank: {name: {"fp32", "exp_avg", "exp_avg_sq"}} (this tp rank's shard, full over dp)."""
    slices: list[dict[str, dict[str, torch.Tensor]]] = []
    common: dict[str, Any] = {}
    steps: dict[str, float] = {}  # parameter -> its optimizer step count
    for t in range(tp):
        model_states = _load(os.path.join(stage_dir, f"mp_rank_{t:02d}_model_states.pt"))
        if t == 0:
            common = {k: model_states.get(k) for k in ("lr_scheduler", "global_steps", "global_samples",
                                                       "skipped_steps")}
        shard: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in model_states["module"].items():
            shard[name] = {"fp32": tensor.float()}  # frozen parameters keep their model weights
        if zero == 0:
            opt = model_states["optimizer"]
            if opt is not None:
                order = meta["optimizer_order"]
                indices = [i for g in opt["param_groups"] for i in g["params"]]
                for i in indices:
                    state = opt["state"].get(i)
                    if state:
                        shard[order[i]].update({k: state[k].float() for k in MOMENTS})
                        steps[order[i]] = float(state["step"])
        else:
            _merge_zero_partitions(stage_dir, t, shard, steps)
        slices.append(shard)
    common["param_steps"] = steps
    return slices, common


def _merge_zero_partitions(stage_dir: str, t: int, shard: dict, steps: dict) -> None:
    """ZeRO 1/2: concatenate each parameter's fragments over the dp partitions, in dp order."""
    files = glob.glob(os.path.join(stage_dir, f"zero_pp_rank_*_mp_rank_{t:02d}_optim_states.pt"))
    by_dp = sorted(files, key=lambda p: int(re.search(r"zero_pp_rank_(\d+)_", os.path.basename(p)).group(1)))
    if not by_dp:
        raise CheckpointError(f"{stage_dir}: no ZeRO optimizer files for tp rank {t}")
    fragments: dict[str, dict[str, list[torch.Tensor]]] = {}
    for path in by_dp:
        osd = _load(path)["optimizer_state_dict"]
        flats = osd["single_partition_of_fp32_groups"]
        states = osd["base_optimizer_state"]["state"]
        for g, mapping in enumerate(osd["param_slice_mappings"]):
            flat = {"fp32": flats[g], **{k: states[g][k] for k in MOMENTS}}
            for name, frag in mapping.items():
                steps[name] = float(states[g]["step"])
                for key, tensor in flat.items():
                    fragments.setdefault(name, {}).setdefault(key, []).append(
                        tensor.narrow(0, frag.start, frag.numel).float())
    for name, parts in fragments.items():
        shape = shard[name]["fp32"].shape
        for key, pieces in parts.items():
            shard[name][key] = torch.cat(pieces).reshape(shape)


def _read_part(part: str, tag: str, meta: dict[str, Any], zero: int, tp: int) -> tuple[dict, dict]:
    """One folder of DeepSpeed files (a stage's, one pipeline chunk's, or the engine a stage
    shared) merged over ZeRO and tp, keyed by the model's names of the parameters `meta` lists."""
    slices, common = _tp_slices(os.path.join(part, tag), meta, zero, tp)
    steps, common["param_steps"] = common["param_steps"], {}
    params = {}
    for name, info in saved_entries(meta).items():
        split = info["tp_split"]
        merged = {}
        for key in slices[0][name]:
            pieces = [s[name][key] for s in slices]
            merged[key] = (merge_shards(pieces, split["dim"], split["stride"], info["shape"][split["dim"]])
                           if split else pieces[0])
            if list(merged[key].shape) != info["shape"]:
                raise CheckpointError(f"{part}: {name} {key} merges to {list(merged[key].shape)}, "
                                      f"params.json says {info['shape']}")
        params[info["hf_name"]] = merged
        if name in steps:
            common["param_steps"][info["hf_name"]] = steps[name]
    return params, common


def saved_metas(ckpt_dir: str, stage: str, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """params.json of every part of a saved stage (one, or one per pipeline chunk), after checking
    the chunks' layer map against the manifest's cut (CheckpointError if it does not hold)."""
    pipe = pipeline_of(manifest, stage)
    metas = [read_stage_params(ckpt_dir, stage, part) for part in part_dirs(ckpt_dir, stage, saved_pp(manifest, stage))]
    problem = check_layer_map(metas, pipe["pp_layers"] if pipe["pp"] > 1 else None, f"{ckpt_dir}/{stage}")
    if problem:
        raise CheckpointError(problem)
    return metas


def read_stage(ckpt_dir: str, stage: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Read and merge (no cache): the full state of one stage, over its pipeline chunks if it had any."""
    layout = manifest["stages"][stage]
    if ep_of(manifest, stage) > 1:  # experts sharded over ep: ds_hetero's own files (expert_state.py), per chunk
        metas = saved_metas(ckpt_dir, stage, manifest)
        chunks = [read_expert_stage(part, meta, ep_of(manifest, stage))
                  for part, meta in zip(part_dirs(ckpt_dir, stage, len(metas)), metas)]
        params = {}
        for chunk in chunks:
            params.update(chunk["params"])  # check_layer_map: no name in two chunks
        return {**chunks[0], "params": params}  # the scheduler and counters: every chunk steps alike
    zero = saved_stage_zero(manifest, stage)
    if zero not in (0, 1, 2):
        raise CheckpointError(f"{ckpt_dir}: ZeRO stage {zero} checkpoints cannot be resharded yet (ZeRO 0, 1, 2 can)")
    metas = saved_metas(ckpt_dir, stage, manifest)
    params, common, steps = {}, None, {}
    # the engine's DeepSpeed files: ckpt_dir/<stage>/<tag>/, or ckpt_dir/<stage>/pp_<k>/<tag>/ (store.py),
    # or, for a stage that shared its engine (never pipelined), ckpt_dir/<its engine's owner>/<tag>/
    parts = part_dirs(ckpt_dir, stage, len(metas))
    if engine_of(manifest, stage) != stage:
        parts = [os.path.join(ckpt_dir, engine_of(manifest, stage))]
    for part, meta in zip(parts, metas):
        part_params, part_common = _read_part(part, manifest["tag"], meta, zero, layout["tp"])
        params.update(part_params)  # check_layer_map: no name in two chunks
        common = common or part_common  # the scheduler and counters: every chunk's engine steps alike
        steps.update(part_common["param_steps"])
    common["param_steps"] = steps
    # the stage's step count where all its parameters agree (they do unless it shared an engine
    # with a stage that had no work in some steps), else the furthest
    common["step"] = max(steps.values()) if steps else None
    return {"params": params, **common}


def stage_full_state(ckpt_dir: str, stage: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The cached full state (ckpt_dir/full_state/<stage>.hf.pt), converting first if absent.

    Written under a temporary name and renamed, so a reader never sees half a file; two ranks
    converting the same stage at once write identical content.
    """
    path = os.path.join(ckpt_dir, CACHE, CACHE_FILE.format(stage))
    if not os.path.isfile(path):
        state = read_stage(ckpt_dir, stage, manifest)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)
        return state
    return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
