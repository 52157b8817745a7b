"""Fill the stages this rank holds from a checkpoint: its tp shard of every tensor, on its device.

The model arrives on the meta device (shapes, no storage) and already sharded: the tp layers
were built on meta too, carrying the shard metadata (`partition_dim`, ...) that says which
rows of each full tensor they hold. For every tensor of a held stage this allocates exactly
the shard on the device and reads exactly its rows from the checkpoint (shard_slices.py,
checkpoint.py); stages held elsewhere stay on meta and are never read.

Non-persistent buffers (rotary `inv_freq`, CLIP's `position_ids`) are not in checkpoints: they
are recomputed by transformers' own `_init_weights` of the module that owns them, the way
`from_pretrained` does, before any parameter is loaded (an initializer that touches a
parameter then touches a meta tensor, which is a no-op). Tied parameters (one tensor under
several names) are filled once and stay one tensor.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping

import torch
from torch import nn

from .safetensors_files import SafetensorsCheckpoint, WeightsError, tensors_by_name
from .shard_slices import shard_slices


@dataclass
class StageLoad:
    """What one stage's materialisation read and allocated on this rank (bytes in the checkpoint's dtype)."""

    tensors: list[str] = field(default_factory=list)  # the model names filled
    bytes_read: int = 0  # everything read from the checkpoint for this stage
    bytes_full: int = 0  # the same tensors, whole: what a fully built stage holds
    sharded_bytes_read: int = 0  # of which tp-sharded tensors: this rank's slices
    sharded_bytes_full: int = 0  # ... and those tensors whole


def loading_device() -> torch.device:
    """The device DeepSpeed will give this rank's engines (its accelerator, by local rank)."""
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().device_name(int(os.environ.get("LOCAL_RANK", "0"))))


def open_weights(model: nn.Module, weights: str | os.PathLike | None) -> SafetensorsCheckpoint | None:
    """The checked checkpoint to fill `model` from; None for a fully built model without weights.

    Pure (headers and the model's metadata only): every rank raises the same error before any
    collective.
    """
    if weights is None:
        on_meta = [n for n, t in tensors_by_name(model) if t.is_meta]
        if on_meta:
            raise WeightsError(
                f"the model has {len(on_meta)} tensors on the meta device (e.g. {on_meta[0]!r}) but no weights; "
                f"pass weights=DIR (a safetensors checkpoint directory) to initialize, or a fully built model")
        return None
    checkpoint = SafetensorsCheckpoint(model, weights)
    checkpoint.check(model)
    return checkpoint


def _module_names(model: nn.Module) -> dict[int, str]:
    names: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), name)
    return names


def _prefix(name: str) -> str:
    return f"{name}." if name else ""


def _pretrained_owner(model: nn.Module) -> dict[int, nn.Module]:
    """module id -> its nearest PreTrainedModel ancestor (or itself), whose `_init_weights` knows it."""
    from transformers import PreTrainedModel

    owner: dict[int, nn.Module] = {}

    def walk(module: nn.Module, current: nn.Module) -> None:
        current = module if isinstance(module, PreTrainedModel) else current
        owner.setdefault(id(module), current)
        for child in module.children():
            walk(child, current)

    walk(model, model)
    return owner


def _sentinel(buf: torch.Tensor) -> torch.Tensor:
    if buf.dtype.is_floating_point or buf.dtype.is_complex:
        return buf.fill_(float("nan"))
    return buf.fill_(torch.iinfo(buf.dtype).min if buf.dtype != torch.bool else False)


def _unset(buf: torch.Tensor) -> bool:
    if buf.dtype.is_floating_point or buf.dtype.is_complex:
        return bool(torch.isnan(buf).any())
    return buf.numel() > 0 and buf.dtype != torch.bool and bool((buf == torch.iinfo(buf.dtype).min).all())


@torch.no_grad()
def _recompute_buffers(model: nn.Module, stage: nn.Module, names: dict[int, str], device: torch.device) -> list[str]:
    """Non-persistent buffers on meta -> recomputed on `device` by transformers' `_init_weights`."""
    owner = _pretrained_owner(model)
    done = []
    for module in stage.modules():
        fresh = {}
        for bname, buf in module._buffers.items():
            if buf is not None and buf.is_meta and bname in module._non_persistent_buffers_set:
                fresh[bname] = module._buffers[bname] = _sentinel(torch.empty_like(buf, device=device))
        if not fresh:
            continue
        owner[id(module)]._init_weights(module)
        for bname, buf in fresh.items():
            full = _prefix(names[id(module)]) + bname
            if _unset(module._buffers[bname]):
                raise WeightsError(
                    f"the non-persistent buffer {full!r} ({type(module).__name__}) is not in checkpoints and "
                    f"transformers' _init_weights does not recompute it; pass a fully built model instead")
            done.append(full)
    return done


@torch.no_grad()
def _fill(read_into, name: str, like: torch.Tensor, tp_rank: int, tp_size: int, device) -> tuple[torch.Tensor, int]:
    """`like`'s shard of the checkpoint tensor `name`, on device; (tensor, elements read).

    `read_into(name, out, runs, dim)` copies the whole tensor (runs None) or rows run by run.
    """
    out = torch.empty(like.shape, dtype=like.dtype, device=device)
    slices = shard_slices(like, tp_rank, tp_size)
    if slices is None:
        return out, read_into(name, out, None, 0)
    numel = read_into(name, out, slices.runs, slices.dim)
    if slices.padding:  # a padded vocabulary's extra rows: logits masked to -inf, weights zero
        out.narrow(slices.dim, out.shape[slices.dim] - slices.padding, slices.padding).zero_()
    return out, numel


def load_stages(
    model: nn.Module,
    stages: Mapping[str, nn.Module],
    tp_coords: Mapping[str, tuple[int, int]],
    checkpoint: SafetensorsCheckpoint,
    device: torch.device | None = None,
) -> dict[str, StageLoad]:
    """Fill every tensor of `stages` (the stage modules this rank holds, cut from `model` and sharded)
    with this rank's slice of the checkpoint; `tp_coords[stage]` = (tp rank, tp size).

    Parameters keep their attributes (the tp shard tags DeepSpeed reads) and `requires_grad`.
    """
    device = device or loading_device()
    names = _module_names(model)
    report = {}
    for stage_name, stage in stages.items():
        _recompute_buffers(model, stage, names, device)
        report[stage_name] = _load_stage(stage, model, names, checkpoint, *tp_coords[stage_name], device)
        meta = [n for n, t in [*stage.named_parameters(), *stage.named_buffers()] if t.is_meta]
        if meta:
            raise WeightsError(f"stage {stage_name}: {meta[0]!r} is still on the meta device after loading")
    return report


def _places(stage: nn.Module, model: nn.Module) -> list[list[tuple[nn.Module, str, str, torch.Tensor]]]:
    """Per tensor of the stage (parameters, persistent buffers), every (module, table, attribute)
    holding it, in the model first (its names are the checkpoint's), then in the stage (a stage
    may hold a tensor of a model module directly, e.g. LLaVA-OneVision's image_newline): tied
    tensors appear once, with all their places."""
    mine = {id(t) for t in [*stage.parameters(), *stage.buffers()]}
    places = defaultdict(list)
    seen = set()
    for module in [*model.modules(), *stage.modules()]:
        if id(module) in seen:
            continue
        seen.add(id(module))
        for pname, p in module._parameters.items():
            if p is not None and id(p) in mine:
                places[id(p)].append((module, "_parameters", pname, p))
        for bname, b in module._buffers.items():
            if b is not None and id(b) in mine and bname not in module._non_persistent_buffers_set:
                places[id(b)].append((module, "_buffers", bname, b))
    return list(places.values())


@torch.no_grad()
def _load_stage(stage, model, names, checkpoint: SafetensorsCheckpoint, tp_rank: int, tp_size: int, device) -> StageLoad:
    load = StageLoad()
    for where in _places(stage, model):
        full_names = [_prefix(names[id(m)]) + attr for m, _, attr, _ in where if id(m) in names]
        name = next((n for n in full_names if checkpoint.key(n) is not None), None)
        if name is None:  # checked before any collective; only reached for a model changed since
            raise WeightsError(f"no checkpoint tensor for {full_names[0]!r}")
        old = where[0][3]
        tensor, numel = _fill(checkpoint.read_into, name, old, tp_rank, tp_size, device)
        if isinstance(old, nn.Parameter):
            new = nn.Parameter(tensor, requires_grad=old.requires_grad)
            new.__dict__.update(old.__dict__)  # the tp shard tags
            for hook in getattr(old, "grad_hooks", ()):  # tensor hooks belong to the old tensor
                new.register_hook(hook)
        else:
            new = tensor
        for module, table, attr, _ in where:
            getattr(module, table)[attr] = new
        key = checkpoint.key(name)
        size = checkpoint.itemsize(key)
        nbytes, full_bytes = numel * size, math.prod(checkpoint.shape_of[key]) * size
        load.tensors.append(name)
        load.bytes_read += nbytes
        load.bytes_full += full_bytes
        if getattr(old, "tensor_model_parallel", False) or getattr(old, "expert_parallel", False):
            load.sharded_bytes_read += nbytes
            load.sharded_bytes_full += full_bytes
    return load
