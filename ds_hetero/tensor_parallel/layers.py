"""Column- and row-parallel linears over an explicit tp group, and the shard bookkeeping.

    layer                  weight              bias      input          output
    ColumnParallelLinear   S(0) [out/tp, in]   S(0)      in the region  S(-1) [.., out/tp]
    RowParallelLinear      S(1) [out, in/tp]   R         S(-1)          R   (or S(seq) with sequence parallelism)

A column layer does no communication: its input must already be *in the tp region*, i.e. have
passed `regions.enter_region`, whose backward sums the partial input gradients the column
shards produce. Entering once per attention or MLP block (not once per q/k/v projection) costs
one collective instead of three. A row layer leaves the region itself: it reduces its partial
output (all-reduce, or reduce-scatter on the sequence dim under sequence parallelism) and then
adds the replicated bias once.

Why not DeepSpeed's `LinearLayer` / `LinearAllreduce` (they do accept an explicit `mp_group`,
and were verified to match on a subgroup): they only train after the process-global
`set_autotp_mode(training=True)` and read class-level switches (`keep_module_on_host`,
`tp_overlap_comm`); the row layer all-reduces its autograd input in place without `mark_dirty`
(and on a `.contiguous()` copy, lost if the product were ever non-contiguous); neither has a
sequence-parallel mode, and a fused qkv needs their sub-parameter classes. Two ~40-line layers
over `ds_hetero.comm` avoid all of that and keep the parameter tags DeepSpeed reads.

Sharded parameters carry Megatron's attributes, which DeepSpeed reads to count each parameter
once in the gradient norm (`deepspeed.runtime.utils.is_model_parallel_parameter`):
`tensor_model_parallel=True`, `partition_dim`, `partition_stride` (segments fused in one weight,
3 for a fused qkv, or their widths where they differ) plus ours, `partition_full_size` (the
unpadded size along `partition_dim`), so `gather_full` can rebuild the unsharded tensor. Replicated parameters carry none of them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .regions import exit_region


def _segments(t: torch.Tensor, dim: int, stride, parts: int = 1) -> tuple[torch.Tensor, ...]:
    """`t` cut into its fused segments along `dim`: `stride` equal ones (an int), or segments of
    the given full widths (a tuple: Qwen3.5's Gated DeltaNet fuses q | k | v of unequal widths,
    key_dim, key_dim, value_dim), each `parts` times narrower in a shard."""
    if isinstance(stride, int):
        return t.chunk(stride, dim) if stride > 1 else (t,)
    return t.split([w // parts for w in stride], dim)


def shard_tensor(full: torch.Tensor, dim: int, rank: int, size: int, stride=1) -> torch.Tensor:
    """This rank's shard of `full` along `dim`.

    With stride s the dim is s equal fused segments (q | k | v) and each segment is split, so a
    rank keeps the same heads of q, k and v; with a tuple of widths, segments of those widths.
    """
    return torch.cat([seg.chunk(size, dim)[rank] for seg in _segments(full, dim, stride)], dim).contiguous()


def mark_sharded(param: nn.Parameter, dim: int, stride, full_size: int) -> nn.Parameter:
    """Tag a shard so DeepSpeed counts it once per tp rank in the norm and `gather_full` can undo it."""
    param.tensor_model_parallel = True
    param.partition_dim = dim
    param.partition_stride = stride
    param.partition_full_size = full_size
    return param


@torch.no_grad()
def gather_full(tensor: torch.Tensor, like: nn.Parameter, group) -> torch.Tensor:
    """The unsharded version of `tensor` (a parameter or its gradient) shaped like `like`'s shards.

    A replicated parameter comes back as is. Not differentiable; for checkpoints and tests.
    """
    if not getattr(like, "tensor_model_parallel", False):
        return tensor.detach().clone()
    pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, tensor.detach().contiguous(), group=group)
    return merge_shards(pieces, like.partition_dim, like.partition_stride, like.partition_full_size)


def merge_shards(pieces: list[torch.Tensor], dim: int, stride, full_size: int) -> torch.Tensor:
    """Undo `shard_tensor` over all tp ranks' shards (in tp rank order); drops vocabulary padding.
    `stride` as in shard_tensor (a list, as a checkpoint manifest's JSON gives it back, is a tuple)."""
    stride = stride if isinstance(stride, int) else tuple(stride)
    per_rank = [_segments(p, dim, stride, len(pieces)) for p in pieces]
    n = len(per_rank[0])
    full = torch.cat([seg[s] for s in range(n) for seg in per_rank], dim)
    return full.narrow(dim, 0, full_size).contiguous()


def _group_coords(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


class ColumnParallelLinear(nn.Linear):
    """Output features split over the tp group; no communication (see the module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group, stride, full_out: int):
        super().__init__(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        self.weight = mark_sharded(nn.Parameter(weight), 0, stride, full_out)
        if bias is not None:
            self.bias = mark_sharded(nn.Parameter(bias), 0, stride, full_out)
        self.group = group
        self.stride = stride

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, stride=1) -> "ColumnParallelLinear":
        rank, size = _group_coords(group)
        bias = None if linear.bias is None else shard_tensor(linear.bias.detach(), 0, rank, size, stride)
        weight = shard_tensor(linear.weight.detach(), 0, rank, size, stride)
        layer = cls(weight, bias, group, stride, linear.out_features)
        layer.requires_grad_(linear.weight.requires_grad)
        return layer

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tp={dist.get_world_size(self.group)}, stride={self.stride}"


class RowParallelLinear(nn.Linear):
    """Input features split over the tp group; reduces its output, then adds the replicated bias."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group, full_in: int,
                 sequence_parallel: bool = False, seq_dim: int = 1):
        super().__init__(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        self.weight = mark_sharded(nn.Parameter(weight), 1, 1, full_in)
        if bias is not None:
            self.bias = nn.Parameter(bias)  # replicated: every rank holds and updates the same bias
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.seq_dim = seq_dim

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, sequence_parallel: bool = False,
                    seq_dim: int = 1) -> "RowParallelLinear":
        rank, size = _group_coords(group)
        weight = shard_tensor(linear.weight.detach(), 1, rank, size)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        layer = cls(weight, bias, group, linear.in_features, sequence_parallel, seq_dim)
        layer.requires_grad_(linear.weight.requires_grad)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = exit_region(F.linear(x, self.weight), self.group, self.sequence_parallel, self.seq_dim)
        # The bias after the reduction: added once, not tp times.
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tp={dist.get_world_size(self.group)}, sp={self.sequence_parallel}"
