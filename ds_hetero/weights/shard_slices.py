"""Which part of the full tensor a tp shard holds, as contiguous runs along the sharded dim.

A sharded parameter carries `partition_dim`, `partition_stride` and `partition_full_size`
(tensor_parallel/layers.py). The rows it holds are found by applying the very function that
shards a full tensor (`shard_tensor`) to the row numbers 0..n-1, so loading a shard and
sharding a loaded tensor cannot disagree. n is the shard's length times tp: the full size, or
for a padded vocabulary the padded size, whose rows past `partition_full_size` are zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..tensor_parallel.layers import shard_tensor


@dataclass(frozen=True)
class ShardSlices:
    """Rows [start, stop) of the full tensor along `dim`, in order, then `padding` zero rows."""

    dim: int
    runs: tuple[tuple[int, int], ...]
    padding: int


def shard_slices(param: torch.Tensor, tp_rank: int, tp_size: int) -> ShardSlices | None:
    """The runs of rows `param` (a tp shard) holds on tp rank `tp_rank`; None for a replicated tensor.

    Experts sharded over ep (expert_parallel/layers.py) hold experts [r * n, (r + 1) * n) of dim 0
    on ep rank r, whatever the tp rank (they are replicated over tp)."""
    if getattr(param, "expert_parallel", False):
        n = param.shape[0]
        return ShardSlices(0, ((param.ep_rank * n, (param.ep_rank + 1) * n),), 0)
    if not getattr(param, "tensor_model_parallel", False):
        return None
    dim, stride, full = param.partition_dim, param.partition_stride, param.partition_full_size
    total = param.shape[dim] * tp_size
    if not full <= total < full + tp_size:
        raise ValueError(f"a shard of {param.shape[dim]} rows on tp {tp_size} cannot hold {full} rows")
    rows = shard_tensor(torch.arange(total), 0, tp_rank, tp_size, stride).tolist()
    real = [r for r in rows if r < full]
    if real != rows[: len(real)]:
        raise ValueError("padding rows must come last in a shard")
    runs: list[tuple[int, int]] = []
    for r in real:
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return ShardSlices(dim, tuple(runs), len(rows) - len(real))
