"""Replicas start equal: every rank trains rank 0's initial model, as stock DeepSpeed does.

A script that seeds every rank differently (ms-swift's `seed + rank`), or any freshly
initialized module (new LoRA adapters, a new projector), builds different initial weights on
different ranks. Stock DeepSpeed broadcasts rank 0's replicated parameters at `initialize`, so
it trains rank 0's model. ds_hetero's stages would otherwise not: DeepSpeed's own broadcast in
each stage engine runs over that stage's dp x cp group from its first member, and a tp shard is
cut from the full tensor of the rank that holds it, so the result would be a mix of several
ranks' models.

So before the model is split and sharded (every rank still holds the whole model, every
placement, pp and tied embedding alike), every parameter and buffer is broadcast from the
first rank of the boundary group (global rank 0) over that group (it spans every stage's ranks),
in buckets of raw bytes. Bytes: every rank receives the whole model once, what stock DeepSpeed's
broadcast over a world-sized dp group moves too (docs/engine.md compares the alternatives).

Skipped: a meta model filled per shard from a checkpoint (`weights=DIR`: every rank reads the
same files; stages/build.py does not call this), and tensors that are meta or already
partitioned by `deepspeed.zero.Init` (they hold no values yet).
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

BUCKET_BYTES = 64 << 20  # per broadcast: few collectives, one bounded staging buffer
ALIGN = 16  # every tensor starts at a multiple of this in the bucket, so any dtype can view it


def state_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter and buffer that holds values, in module order: the same
    list on every rank (the same model class and config). A tied parameter appears once."""
    out, seen = [], set()
    for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        if id(t) in seen or t.is_meta or not t.numel() or hasattr(t, "ds_id"):
            continue
        seen.add(id(t))
        out.append((name, t))
    return out


def equalize_replicas(model: torch.nn.Module, group, src: int, device: torch.device | str) -> list[str]:
    """Make every rank of `group` hold `src`'s values of every parameter and buffer of `model`
    (collective over `group`; `src` a global rank). Returns the names whose values this rank
    had built differently (empty on `src`). `device`: where the staging buffer lives, one the
    group's backend can broadcast from (the device the stage engines will train on)."""
    tensors = state_tensors(model)
    differed: list[str] = []
    bucket, size = [], 0
    for name, t in tensors:
        nbytes = _padded(t.numel() * t.element_size())
        if bucket and size + nbytes > BUCKET_BYTES:
            differed += _broadcast(bucket, size, group, src, device)
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        differed += _broadcast(bucket, size, group, src, device)
    return differed


def _padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, flat (a copy only where it is not contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _broadcast(bucket, size: int, group, src: int, device) -> list[str]:
    flat = torch.empty(size, dtype=torch.uint8, device=device)
    is_src = dist.get_rank() == src
    offsets, at = [], 0
    for _, t in bucket:
        offsets.append(at)
        if is_src:
            raw = _raw(t)
            flat[at:at + raw.numel()].copy_(raw)
        at += _padded(t.numel() * t.element_size())
    dist.broadcast(flat, src, group=group)
    if is_src:
        return []
    differed = []
    for (name, t), at in zip(bucket, offsets):
        got = flat[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        if not torch.equal(got.to(t.device), t.detach()):
            differed.append(name)
            with torch.no_grad():
                t.copy_(got)
    return differed
