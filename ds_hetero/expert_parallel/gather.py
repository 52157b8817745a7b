"""Full expert tensors from their ep shards (checkpoints, save_pretrained, tests). Not differentiable."""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_experts(tensor: torch.Tensor, like) -> torch.Tensor:
    """`[E, ...]` from every ep rank's `[E / ep, ...]` (in ep-rank order); collective over `like.ep_group`."""
    group = like.ep_group
    pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, tensor.detach().contiguous(), group=group)
    return torch.cat(pieces, 0)


def on_expert_writer(stage) -> bool:
    """Whether this rank's ep group holds the copy of the experts a writer saves: the ep group of
    dp x cp position 0 (the stage's writer, its first rank, belongs to it)."""
    c = stage.coord
    return (c.cp + stage.layout.cp * c.dp) < stage.layout.ep
