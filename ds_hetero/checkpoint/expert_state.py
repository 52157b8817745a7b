"""A language stage with experts sharded over ep (expert_parallel/): its checkpoint files.

    DIR/<tag>/language/params.json              full shapes; an expert-sharded weight has "ep_split"
    DIR/<tag>/language/ep_state/dense.pt         every other parameter, full (over tp and ZeRO), and
                                                 the scheduler, step and counters; the stage's first rank
    DIR/<tag>/language/ep_state/experts_ep<r>.pt ep rank r's experts [r E/ep, (r+1) E/ep) of every expert
                                                 weight (full over ZeRO), written by ep rank r of the ep
                                                 group at dp x cp position 0, tp rank 0
    DIR/<tag>/language/pp_<k>/...                a pipelined stage: the same per chunk (its layers' own,
                                                 under the model's names; each chunk's ep groups are cut
                                                 from its own dp x cp ranks), its first rank the dense writer

Each entry is {"fp32": the master weight, "exp_avg", "exp_avg_sq"} (weights only for a parameter
the optimizer does not hold). `read_expert_stage` turns the files back into the full state that
full_state.py gives for any other stage (experts concatenated in ep-rank order, each file's
recorded ep rank and expert range checked against its name), so an ep checkpoint loads into any
ep (1 included) by the same reshard.py, and a checkpoint of any other layout loads into ep > 1
(reshard.py slices dim 0 for the rank's experts).

Why not DeepSpeed's own files: with MoE layers its engine writes per-expert files only for its
AutoEP layer's renamed weights (`experts.w1/w2/w3`, with AutoEP's affine-map metadata), which
ds_hetero keeps under their Hugging Face names (expert_parallel/layers.py), and its ZeRO 0 files
keep the optimizer state of dp rank 0 only (each ep rank's experts have their own); and a layout
change needs full tensors anyway. So this stage's state is gathered live, by name: the ZeRO
partitions by DeepSpeed's `safe_get_full_fp32_param` / `safe_get_full_optimizer_state` (over the
expert-data-parallel group for experts, dp for the rest; ZeRO 3's partitions too: zero3_state.py),
tp shards by `gather_full`; experts are not gathered over ep: each ep rank writes its own. The same
files load into any ZeRO stage (reshard.py; ZeRO 3 through zero3_state.py).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..expert_parallel.gather import merge_expert_blocks
from ..tensor_parallel import gather_full
from .manifest import CheckpointError
from .zero3_state import read_entry

FOLDER = "ep_state"
DENSE = "dense.pt"
EXPERTS = "experts_ep{:02d}.pt"
MOMENTS = ("exp_avg", "exp_avg_sq")
COUNTERS = ("global_steps", "global_samples", "skipped_steps")


def is_expert(p) -> bool:
    return getattr(p, "expert_parallel", False)


def expert_slot(param) -> int:
    """Which of the ep blocks of experts this rank's shard of `param` is
    (its ep rank); one function, so that a negative control can load the wrong block."""
    return param.ep_rank


def _relink(optimizer) -> None:
    """DeepSpeed 0.19 links the parameters' views of Adam's state after the first param group's
    first step, before the later groups (the experts' MoE groups) have any: link again."""
    optimizer._hp_optimizer_states_linked = False
    optimizer._lazy_init_hp_params_optimizer_state()


def _live_entry(engine, p, zero: int) -> tuple[dict[str, torch.Tensor], float | None]:
    """(this rank's tp shard of p, full over ZeRO: weights and moments; the optimizer step).
    Collective over p's ZeRO group under ZeRO 1/2 (every rank of the stage calls it per parameter)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    optimizer = engine.optimizer
    if zero == 3:  # a partition over dp (or the experts' expert-data-parallel group): zero3_state.py
        return read_entry(engine, p)
    if zero:
        if not hasattr(p, "_hp_mapping") or not optimizer.optimizer.state:  # frozen, or no step taken yet
            return {"fp32": p.detach().float().clone()}, None
        entry = {"fp32": safe_get_full_fp32_param(p), **{k: safe_get_full_optimizer_state(p, k) for k in MOMENTS}}
        step = next(iter(optimizer.optimizer.state.values()))["step"]
        return {k: v.float() for k, v in entry.items()}, float(step)
    state = optimizer.state.get(p) if optimizer is not None else None
    if not state:
        return {"fp32": p.detach().float().clone()}, None
    return ({"fp32": p.detach().float().clone(), **{k: state[k].float().clone() for k in MOMENTS}},
            float(state["step"]))


def save_expert_stage(stage, model, folder: str) -> None:
    """Write the ep stage's files under `folder` (its stage folder); all ranks of the stage call it."""
    from .layer_map import hf_names

    engine, module = stage.engine, stage.engine.module
    zero = engine.zero_optimization_stage() if stage.trains else 0
    if zero in (1, 2):
        _relink(engine.optimizer)
    to_hf = hf_names(module, model)
    c = stage.coord
    dense_writer = stage.groups.rank == stage.norm_rank  # the stage's first rank, or its chunk's
    expert_writer = c.tp == 0 and (c.cp + stage.layout.cp * c.dp) < stage.layout.ep
    dense, experts, steps = {}, {}, set()
    for name, p in module.named_parameters():  # the same order on every rank: collectives pair up
        entry, step = _live_entry(engine, p, zero)
        if step is not None:
            steps.add(step)
        if is_expert(p):  # replicated over tp; this rank's experts only
            if expert_writer:
                experts[to_hf[name]] = entry
        else:
            entry = {k: gather_full(v, p, stage.groups.tp) for k, v in entry.items()}
            if dense_writer:
                dense[to_hf[name]] = entry
    if len(steps) > 1:
        raise CheckpointError(f"stage {stage.name}: parameters at different optimizer steps {sorted(steps)}")
    out = os.path.join(folder, FOLDER)
    os.makedirs(out, exist_ok=True)
    if dense_writer:
        scheduler = engine.lr_scheduler
        common = {"lr_scheduler": scheduler.state_dict() if scheduler is not None else None,
                  "step": steps.pop() if steps else None, **{k: getattr(engine, k) for k in COUNTERS}}
        torch.save({"params": dense, "common": common}, os.path.join(out, DENSE))
    if expert_writer:
        r, ep = stage.layout.ep_rank(stage.groups.rank), stage.layout.ep
        some = next((p for p in module.parameters() if is_expert(p)), None)
        total = some.ep_full_size if some is not None else 0
        torch.save({"ep": ep, "ep_rank": r, "experts": [r * total // ep, (r + 1) * total // ep], "params": experts},
                   os.path.join(out, EXPERTS.format(r)))


def _load(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing (an ep checkpoint has one dense file and one file per ep rank)")
    return torch.load(path, map_location="cpu", weights_only=False)


def read_expert_stage(part: str, meta: dict[str, Any], ep: int) -> dict[str, Any]:
    """The full state (full_state.py's format) of an ep stage (or one pipeline chunk of it) saved under
    `part` with `ep` ranks."""
    from .layer_map import saved_entries

    dense = _load(os.path.join(part, FOLDER, DENSE))
    params = dict(dense["params"])
    entries = {info["hf_name"]: info for info in saved_entries(meta).values()}
    shards = [_load(os.path.join(part, FOLDER, EXPERTS.format(r))) for r in range(ep)]
    weights = [i for i in entries.values() if i.get("ep_split") and i["ep_split"].get("outer", 1) == 1
               and i["ep_split"].get("dim", 0) == 0 and len(i["shape"]) == 3]  # the fused expert weights: [E, ...]
    total = weights[0]["shape"][0] if weights else 0
    for r, shard in enumerate(shards):
        want = [r * total // ep, (r + 1) * total // ep]
        if shard["ep"] != ep or shard["ep_rank"] != r or list(shard["experts"]) != want:
            raise CheckpointError(
                f"{os.path.join(part, FOLDER, EXPERTS.format(r))} holds experts {shard['experts'][0]}.."
                f"{shard['experts'][1] - 1} of ep rank {shard['ep_rank']} (ep {shard['ep']}), but is the file of ep rank "
                f"{r}, experts {want[0]}..{want[1] - 1} (experts in the wrong ep slot)")
    for name, info in entries.items():
        if info.get("ep_split"):
            pieces = [s["params"].get(name) for s in shards]
            if any(p is None for p in pieces):
                raise CheckpointError(f"{part}: expert weight {name} missing from an ep rank's file")
            split = info["ep_split"]
            params[name] = {k: merge_expert_blocks([p[k] for p in pieces], split.get("dim", 0), split.get("outer", 1))
                            for k in pieces[0]}
        if name not in params:
            raise CheckpointError(f"{part}: {name} is in params.json but in no file of {FOLDER}/")
        got = [list(v.shape) for v in params[name].values()]
        if any(s != info["shape"] for s in got):
            raise CheckpointError(f"{part}: {name} merges to {got[0]}, params.json says {info['shape']}")
    return {"params": params, **dense["common"]}
