"""Full expert tensors from their ep shards (checkpoints, save_pretrained, tests). Not differentiable.

An expert-sharded tensor's dim `ep_dim` (tag on the parameter; 0 by default) is, viewed as
`(ep_outer, E x k)`, E experts of k entries each, expert-major: ep rank r holds experts
[r E/ep, (r+1) E/ep) of every one of the `ep_outer` groups. The fused expert weights are
`ep_dim 0, ep_outer 1` (dim 0 is the expert); PEFT's LoRA factors of them (expert_parallel/lora.py)
are `lora_A [E r, in]` (0, 1: r rows per expert) and `lora_B [out, r E]` (1, r: the expert is
the fastest index of dim 1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ep_split(like) -> dict[str, int]:
    """How a parameter is sharded over ep: {"dim", "outer"} (a checkpoint's params.json records it)."""
    return {"dim": int(getattr(like, "ep_dim", 0)), "outer": int(getattr(like, "ep_outer", 1))}


def _grouped(t: torch.Tensor, dim: int, outer: int) -> torch.Tensor:
    shape = list(t.shape)
    return t.reshape(*shape[:dim], outer, shape[dim] // outer, *shape[dim + 1:])


def expert_block(full: torch.Tensor, dim: int, outer: int, slot: int, ep: int) -> torch.Tensor:
    """ep rank `slot`'s shard of the full tensor `full`."""
    grouped = _grouped(full, dim, outer)
    per = grouped.shape[dim + 1] // ep
    block = grouped.narrow(dim + 1, slot * per, per)
    shape = list(full.shape)
    shape[dim] = outer * per
    return block.reshape(shape).contiguous()


def merge_expert_blocks(pieces: list[torch.Tensor], dim: int, outer: int) -> torch.Tensor:
    """The full tensor from every ep rank's shard, in ep-rank order (the inverse of expert_block)."""
    full = torch.cat([_grouped(p, dim, outer) for p in pieces], dim + 1)
    shape = list(pieces[0].shape)
    shape[dim] *= len(pieces)
    return full.reshape(shape)


def expert_full_shape(like, shape) -> list[int]:
    """The full shape of an expert-sharded parameter whose local shape is `shape`."""
    out, split = list(shape), ep_split(like)
    out[split["dim"]] *= like.ep_size
    return out


def gather_experts(tensor: torch.Tensor, like) -> torch.Tensor:
    """The full tensor from every ep rank's shard; collective over `like.ep_group`."""
    group = like.ep_group
    pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, tensor.detach().contiguous(), group=group)
    split = ep_split(like)
    return merge_expert_blocks(pieces, split["dim"], split["outer"])


def on_expert_writer(stage) -> bool:
    """Whether this rank's ep group holds the copy of the experts a writer saves: the ep group of
    dp x cp position 0 (the stage's writer, its first rank, belongs to it)."""
    c = stage.coord
    return (c.cp + stage.layout.cp * c.dp) < stage.layout.ep
