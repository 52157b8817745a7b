"""A PEFT adapter from the live, sharded LoRA weights: what `PeftModel.from_pretrained` loads.

    save_peft_adapter(engine, peft_model, "out/adapter")     # every rank calls it

Per stage, on the stage's ranks only, each LoRA tensor is made whole as `save_pretrained` makes
any weight (ZeRO-3 partitions gathered over the stage's dp group, tp shards over its tp group by
their shard tags; the LoRA shards carry the tags of the tp layer classes, tensor_parallel/lora.py);
the first rank of each stage keeps them. The adapter is small (r x width per layer), so the
stages' pieces travel to rank 0 in one all_gather_object, and rank 0 writes them with PEFT's own
`save_pretrained` (adapter_config.json + adapter_model.safetensors, PEFT's key names).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ...checkpoint.hf_gather import full_tensor
from ...tensor_parallel.lora import is_lora_layer

PEFT_PREFIX = "base_model.model."  # PeftModel.state_dict() names = this + the base model's names


def _lora_names(engine) -> dict[int, str]:
    """id(parameter) -> base-model name, for every parameter of every LoRA adapter (A, B)."""
    out = {}
    for name, module in engine.model.named_modules():
        if is_lora_layer(module):
            for part in ("lora_A", "lora_B"):
                for pname, p in getattr(module, part).named_parameters():
                    out[id(p)] = f"{name}.{part}.{pname}"
    return out


def gather_lora(engine) -> dict[str, torch.Tensor]:
    """Every LoRA tensor, whole, by base-model name, on rank 0 ({} elsewhere); collective over all ranks."""
    names = _lora_names(engine)
    stages = engine.stages
    mine: dict[str, torch.Tensor] = {}
    for stage in stages:
        if not stage.held:
            continue
        keep = stage.coord.dp == 0 and stage.coord.cp == 0  # the writer's tp group gathers
        is_first = stages.rank == stage.first_rank
        with stage.context():
            for p in stage.module.parameters():  # the same order on every rank of the stage
                if id(p) in names:
                    value = full_tensor(stage, p, keep)  # the same gather as save_pretrained's
                    if is_first:
                        mine[names[id(p)]] = value
    parts = [None] * dist.get_world_size(stages.boundary_group)
    dist.all_gather_object(parts, mine, group=stages.boundary_group)
    return {k: v for part in parts for k, v in part.items()} if stages.rank == 0 else {}


def save_peft_adapter(engine, peft_model, save_dir: str | os.PathLike) -> None:
    """adapter_config.json + adapter_model.safetensors in `save_dir`, written by rank 0; all ranks call it."""
    tensors = gather_lora(engine)
    if engine.rank == 0:
        state = {PEFT_PREFIX + name: t for name, t in tensors.items()}
        peft_model.save_pretrained(os.fspath(save_dir), state_dict=state)
    dist.barrier(group=engine.groups.boundary)
