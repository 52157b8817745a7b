"""Differentiable collectives: one autograd.Function per forward/backward pair.

Every function takes its process group explicitly (there is no default group), works on any
backend (gloo on CPU, NCCL on GPU: the device comes from the tensor, the backend from the
group), never communicates in place on a tensor autograd handed it, and is the identity when
the group has one rank (no autograd node is created then).

Gradient convention (Megatron's). A tensor's *placement* over the group is R (replicated:
every rank holds the same value), S(d) (sharded on dim d) or P (partial: the value is the sum
over ranks). Gradients of R tensors are R: every rank holds the full, identical gradient, as
long as the computation after them is duplicated. A tensor that enters tp-parallel compute
(a column-parallel linear) gets partial gradients; the pair that brought it in sums them.

    wrapper               forward                    backward               placements fwd
    copy_to_region        identity                   all-reduce (sum)       R -> R, grad P -> R
    reduce_from_region    all-reduce (sum)           identity               P -> R, grad R -> R
    all_gather            all-gather dim             reduce-scatter dim     S(d) -> R, grad P -> S(d)
    gather_from_region    all-gather dim             split dim              S(d) -> R, grad R -> S(d)
    split_to_region       split dim (no comm)        all-gather dim         R -> S(d), grad S(d) -> R
    reduce_scatter        reduce-scatter dim         all-gather dim         P -> S(d), grad S(d) -> R
    all_to_all            all-to-all, uneven rows    inverse all-to-all     rows permuted among ranks

The two all-gathers differ only in what they assume about the downstream gradient: use
`all_gather` when the gathered tensor feeds tp-parallel compute (sequence parallelism), and
`gather_from_region` when every rank then computes the same thing.

Each backward calls the dual Function's `.apply`, so the pairing is visible in the code and
double backward works. Even splits are required for the gather/scatter pairs (a ValueError is
raised before any communication); the all-to-all takes arbitrary split sizes, zeros included.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

# torch 2.13 renamed the tensor-in/tensor-out collectives; older torch only has the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# ---------------------------------------------------------------------------- tensor helpers
def _size(group) -> int:
    if group is None:
        raise TypeError("pass a process group explicitly; ds_hetero never defaults to the world group")
    return dist.get_world_size(group)


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    # A fresh contiguous buffer: gloo rejects non-contiguous tensors, and x may be an autograd input.
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=group)
    return out


def _check_divisible(x: torch.Tensor, dim: int, n: int, what: str) -> None:
    if x.shape[dim] % n != 0:
        raise ValueError(f"{what}: dim {dim} of shape {tuple(x.shape)} is not divisible by the group size {n}")


def _all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    n = _size(group)
    front = x.movedim(dim, 0).contiguous()  # the single-tensor collectives concatenate on dim 0
    out = front.new_empty((n * front.shape[0], *front.shape[1:]))
    _all_gather_single(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    n = _size(group)
    _check_divisible(x, dim, n, "reduce_scatter")
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((front.shape[0] // n, *front.shape[1:]))
    _reduce_scatter_single(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def _split(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    n = _size(group)
    _check_divisible(x, dim, n, "split")
    chunk = x.shape[dim] // n
    # clone: a narrow view of the input must not escape (it would alias an autograd input).
    return x.narrow(dim, dist.get_rank(group) * chunk, chunk).clone(memory_format=torch.contiguous_format)


def _all_to_all(x: torch.Tensor, send: Sequence[int], recv: Sequence[int], group) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x, output_split_sizes=list(recv), input_split_sizes=list(send), group=group)
    return out


# ---------------------------------------------------------------------------- the pairs
class _CopyToRegion(torch.autograd.Function):
    """fwd: identity; bwd: all-reduce. Input R; the gradient arriving is P (tp-parallel compute)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _ReduceFromRegion.apply(grad, ctx.group), None


class _ReduceFromRegion(torch.autograd.Function):
    """fwd: all-reduce; bwd: identity. Output R with an R gradient, so each partial input gets it whole."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _CopyToRegion.apply(grad, ctx.group), None


class _AllGather(torch.autograd.Function):
    """fwd: all-gather dim; bwd: reduce-scatter dim. The gathered tensor's gradient is P."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _ReduceScatter.apply(grad, ctx.dim, ctx.group), None, None


class _ReduceScatter(torch.autograd.Function):
    """fwd: reduce-scatter dim; bwd: all-gather dim. Input P, output S(dim)."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _AllGather.apply(grad, ctx.dim, ctx.group), None, None


class _GatherFromRegion(torch.autograd.Function):
    """fwd: all-gather dim; bwd: split dim. The gathered tensor's gradient is R."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _SplitToRegion.apply(grad, ctx.dim, ctx.group), None, None


class _SplitToRegion(torch.autograd.Function):
    """fwd: keep this rank's chunk of dim (no communication); bwd: all-gather dim. Input R."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _split(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _GatherFromRegion.apply(grad, ctx.dim, ctx.group), None, None


class _AllToAll(torch.autograd.Function):
    """fwd: all-to-all of rows (dim 0) with uneven splits; bwd: the inverse all-to-all (splits swapped)."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _all_to_all(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad, ctx.recv, ctx.send, ctx.group), None, None, None


# ---------------------------------------------------------------------------- public wrappers
def copy_to_region(x: torch.Tensor, group) -> torch.Tensor:
    """fwd: identity; bwd: all-reduce. Enter tp-parallel compute with a replicated input."""
    return x if _size(group) == 1 else _CopyToRegion.apply(x, group)


def reduce_from_region(x: torch.Tensor, group) -> torch.Tensor:
    """fwd: all-reduce; bwd: identity. Leave tp-parallel compute with a replicated output."""
    return x if _size(group) == 1 else _ReduceFromRegion.apply(x, group)


def all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """fwd: all-gather dim; bwd: reduce-scatter dim. For a gathered input of tp-parallel compute."""
    return x if _size(group) == 1 else _AllGather.apply(x, dim % x.dim(), group)


def reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """fwd: reduce-scatter dim; bwd: all-gather dim. Leave tp-parallel compute sharded on dim."""
    if _size(group) == 1:
        return x
    _check_divisible(x, dim, _size(group), "reduce_scatter")
    return _ReduceScatter.apply(x, dim % x.dim(), group)


def gather_from_region(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """fwd: all-gather dim; bwd: split dim. For a gathered tensor every rank then uses alike."""
    return x if _size(group) == 1 else _GatherFromRegion.apply(x, dim % x.dim(), group)


def split_to_region(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """fwd: split dim (keep this rank's chunk); bwd: all-gather dim."""
    if _size(group) == 1:
        return x
    _check_divisible(x, dim, _size(group), "split_to_region")
    return _SplitToRegion.apply(x, dim % x.dim(), group)


def all_to_all(x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], group) -> torch.Tensor:
    """fwd: all-to-all of rows (dim 0), uneven splits; bwd: inverse all-to-all (send/recv swapped).

    `send_splits[p]` rows of `x` (in order) go to group rank p; `recv_splits[p]` rows arrive
    from it. Every rank's send_splits[q] must equal rank q's recv_splits[me] (the caller's plan
    guarantees it; a mismatch is a hang or a backend error, as for torch's own call).
    """
    n = _size(group)
    send, recv = tuple(int(s) for s in send_splits), tuple(int(r) for r in recv_splits)
    if len(send) != n or len(recv) != n:
        raise ValueError(f"all_to_all: need {n} send and recv splits, got {len(send)} and {len(recv)}")
    if sum(send) != x.shape[0]:
        raise ValueError(f"all_to_all: send splits sum to {sum(send)} but x has {x.shape[0]} rows")
    return x if n == 1 else _AllToAll.apply(x, send, recv, group)
