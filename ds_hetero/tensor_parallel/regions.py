"""Entering and leaving tp-parallel compute (a "region"), with or without sequence parallelism.

    enter_region   R      -> R, grads summed      copy_to_region  (fwd identity,   bwd all-reduce)
                   S(seq) -> R, grads scattered   all_gather      (fwd all-gather, bwd reduce-scatter)
    exit_region    P      -> R                    reduce_from_region (fwd all-reduce, bwd identity)
                   P      -> S(seq)               reduce_scatter  (fwd reduce-scatter, bwd all-gather)

An attention or MLP block of a Hugging Face model becomes one region: its input enters once
(a forward pre-hook on the block, so the module tree and parameter names stay as HF wrote
them), its column-parallel projections run locally, its row-parallel projection leaves.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm import all_gather, copy_to_region, reduce_from_region, reduce_scatter


def enter_region(x: torch.Tensor, group, sequence_parallel: bool = False, seq_dim: int = 1) -> torch.Tensor:
    """Input of tp-parallel compute: replicated, or gathered from sequence shards under sp."""
    return all_gather(x, seq_dim, group) if sequence_parallel else copy_to_region(x, group)


def exit_region(y: torch.Tensor, group, sequence_parallel: bool = False, seq_dim: int = 1) -> torch.Tensor:
    """Sum of the tp ranks' partial outputs: replicated, or scattered on the sequence under sp."""
    return reduce_scatter(y, seq_dim, group) if sequence_parallel else reduce_from_region(y, group)


class EnterRegionHook:
    """Forward pre-hook (with_kwargs=True) applying `enter_region` to a block's hidden states.

    HF blocks receive them as the first positional argument or as `hidden_states=`.
    """

    def __init__(self, group, sequence_parallel: bool = False, seq_dim: int = 1):
        self.group, self.sequence_parallel, self.seq_dim = group, sequence_parallel, seq_dim

    def __call__(self, module, args, kwargs):
        enter = lambda x: enter_region(x, self.group, self.sequence_parallel, self.seq_dim)  # noqa: E731
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": enter(kwargs["hidden_states"])}
        return (enter(args[0]), *args[1:]), kwargs

    def __repr__(self) -> str:
        return f"EnterRegionHook(tp={dist.get_world_size(self.group)}, sp={self.sequence_parallel})"
