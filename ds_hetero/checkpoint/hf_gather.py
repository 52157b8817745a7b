"""`HeteroEngine.save_pretrained`: gather the live, sharded weights into a Hugging Face checkpoint.

Per stage, on the stage's ranks only:
    ZeRO-3 partitions   -> deepspeed.zero.GatheredParameters over the stage's dp group
    tp shards           -> gather_full over the tp group (the shard tags every tp parameter
                           carries: partition_dim / stride / full size; drops vocabulary padding)
    names               -> by identity with `model.state_dict(keep_vars=True)`: the stage modules
                           share the model's parameter objects, so each tensor gets the name(s)
                           the model itself uses (tied aliases keep every name; the writer drops them)

Who writes what: the first rank of each stage (of each pipeline stage of a pipelined language
stage) writes that stage's weights to its own file (`model-0000i-of-0000n.safetensors`), then rank 0 writes the index and the configs from the
(small) weight maps every writer reports. Why not gather everything on rank 0: in disaggregated
placement no rank holds both stages, and moving one stage's full weights over the boundary
would cost rank 0 the memory of the whole model and the network the whole model's bytes; with
one file per stage nothing but names and sizes crosses the boundary, and both writers write at
the same time. `from_pretrained` reads any file split listed by the index.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict

import torch
import torch.distributed as dist

from ..stages.tied_embeddings import is_shared_copy
from ..tensor_parallel import gather_full
from .hf_export import shard_file_name, write_index, write_weights_file


def _stage_tensors(stages, model) -> dict[str, list[torch.Tensor]]:
    """Every stage's parameters and persistent buffers (deduplicated, module order); checks coverage."""
    named = model.state_dict(keep_vars=True)
    owner: dict[int, str] = {}
    out: dict[str, list[torch.Tensor]] = {}
    for stage in stages:
        tensors = []
        for t in list(stage.module.parameters()) + list(stage.module.buffers()):
            if is_shared_copy(t):  # a tied weight's copy on the last pipeline stage: the first writes it
                continue
            if id(t) not in owner:
                owner[id(t)] = stage.name
                tensors.append(t)
        out[stage.name] = tensors
    # with a pipelined language stage the other pipeline stages' layers are on the meta device
    # here: their ranks write them (the union is checked after the files are written)
    missing = sorted(n for n, t in named.items() if id(t) not in owner and not t.is_meta and not is_shared_copy(t))
    if missing:  # the adapter's stages must cover the whole model, or the checkpoint would be partial
        raise RuntimeError(f"save_pretrained: {len(missing)} model tensors belong to no stage, e.g. {missing[:3]}")
    return out


def full_tensor(stage, t: torch.Tensor, on_writer_replica: bool) -> torch.Tensor | None:
    """The full tensor on the ranks of the writer's tp group (None elsewhere); collective over the stage."""
    import deepspeed

    gathered = (deepspeed.zero.GatheredParameters([t], modifier_rank=None) if hasattr(t, "ds_id")
                else contextlib.nullcontext())
    with gathered:
        if getattr(t, "expert_parallel", False):  # the writer's ep group gathers its experts
            from ..expert_parallel.gather import gather_experts, on_expert_writer

            if not on_expert_writer(stage):
                return None
            full = gather_experts(t.data, t).cpu()
            return full if on_writer_replica else None
        if not on_writer_replica:
            return None
        if getattr(t, "tensor_model_parallel", False):
            return gather_full(t.data, t, stage.groups.tp).cpu()
        return t.detach().to("cpu", copy=True)


def save_pretrained(stages, model, save_dir: str | os.PathLike) -> None:
    """Write a consolidated Hugging Face checkpoint of the stages' current weights; all ranks call it."""
    save_dir = os.fspath(save_dir)
    names: dict[int, list[str]] = defaultdict(list)
    for name, t in model.state_dict(keep_vars=True).items():
        names[id(t)].append(name)
    per_stage = _stage_tensors(stages, model)  # raises on every rank alike, before any collective
    # one file per stage, and per pipeline stage of a pipelined stage (written by its first rank)
    first_file = {}
    for stage in stages:
        first_file[stage.name] = sum(s.layout.pp for s in stages if list(stages.stages).index(s.name)
                                     < list(stages.stages).index(stage.name))
    n_files = sum(s.layout.pp for s in stages)
    report = ({}, 0, [])  # (checkpoint name -> file, bytes, model names written)
    for stage in stages:
        if not stage.held:  # disaggregated: another rank set holds it
            continue
        i = first_file[stage.name] + stage.coord.pp
        on_writer_replica = stage.coord.dp == 0 and stage.coord.cp == 0
        is_writer = stages.rank == stage.norm_rank  # the stage's (pipeline stage's) first rank
        full = {}
        with stage.context():
            for t in per_stage[stage.name]:
                value = full_tensor(stage, t, on_writer_replica)
                if is_writer:
                    for name in names[id(t)]:
                        full[name] = value
        if is_writer:
            weight_map, size = write_weights_file(save_dir, shard_file_name(i, n_files), full, model)
            report = ({**report[0], **weight_map}, report[1] + size, report[2] + list(full))
    reports = [None] * dist.get_world_size(stages.boundary_group)
    dist.all_gather_object(reports, report, group=stages.boundary_group)
    weight_map = {k: v for r in reports for k, v in r[0].items()}
    missing = sorted(set(model.state_dict(keep_vars=True)) - {n for r in reports for n in r[2]})
    if missing:  # every rank sees the same reports: all raise alike
        raise RuntimeError(f"save_pretrained: {len(missing)} model tensors were written by no rank, e.g. {missing[:3]}")
    if stages.rank == 0:
        write_index(save_dir, weight_map, sum(r[1] for r in reports), model)
    dist.barrier(group=stages.boundary_group)
