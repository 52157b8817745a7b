"""Shards that are not linears: a depthwise convolution's channels and a module's per-head vectors.

    shard                      weight                         input          output
    shard_depthwise_conv       S(0) [C/tp, 1, K] (segments)   S(channels)    S(channels)
    shard_head_vector          S(0) [heads/tp]                -              -

A depthwise convolution (`groups == channels`, Qwen3.5's Gated DeltaNet conv1d over its fused
q | k | v channels) mixes time within each channel and never across channels, so splitting its
channels exactly as the column projection before it splits its outputs is exact with no
communication: each rank convolves the channels it produced. The split must follow the same
fused segments (q, k and v each split by heads, `stride` a tuple of their widths), or a rank
would convolve another rank's q with its own kernel rows. Per-head vectors (Gated DeltaNet's
`A_log`, `dt_bias`: one decay per value head) are split the same way as the heads they belong to.

Both carry the shard tags of layers.py (`partition_dim` 0, the stride, the full size), so the
gradient norm, checkpoints, per-shard loading and `gather_full` treat them as any tp shard.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from .layers import mark_sharded, shard_tensor


def is_depthwise(conv: nn.Module) -> bool:
    return isinstance(conv, nn.Conv1d) and conv.groups == conv.in_channels == conv.out_channels


def shard_depthwise_conv(conv: nn.Conv1d, group, stride=1) -> nn.Conv1d:
    """A depthwise Conv1d holding this rank's channels (split as `shard_tensor` with `stride`)."""
    if not is_depthwise(conv):
        raise TypeError(f"not a depthwise Conv1d: {conv}")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    local = conv.in_channels // size
    # the same padding and kernel; only the channel count (and so the group count) is this rank's
    shard = nn.Conv1d(local, local, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                      dilation=conv.dilation, groups=local, bias=conv.bias is not None, device="meta")
    shard.weight = mark_sharded(nn.Parameter(shard_tensor(conv.weight.detach(), 0, rank, size, stride)),
                                0, stride, conv.in_channels)
    if conv.bias is not None:
        shard.bias = mark_sharded(nn.Parameter(shard_tensor(conv.bias.detach(), 0, rank, size, stride)),
                                  0, stride, conv.in_channels)
    shard.requires_grad_(conv.weight.requires_grad)
    return shard


def shard_head_vector(module: nn.Module, name: str, group) -> None:
    """Replace the parameter `module.<name>` (one entry per head, dim 0) by this rank's heads' entries."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    full = getattr(module, name)
    param = nn.Parameter(shard_tensor(full.detach(), 0, rank, size), requires_grad=full.requires_grad)
    setattr(module, name, mark_sharded(param, 0, 1, full.shape[0]))
