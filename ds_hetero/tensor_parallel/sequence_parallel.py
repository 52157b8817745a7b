"""Sequence parallelism for a tp-sharded language decoder (Megatron's, over the stage's tp group).

Between blocks the hidden states are S(seq): each tp rank holds [B, S/tp, H] instead of the
full replicated [B, S, H], so norms, residual adds and dropout run on 1/tp of the tokens and
activation memory drops by tp. At block edges the regions switch collectives (regions.py):
enter = all-gather on seq (bwd reduce-scatter), exit = reduce-scatter on seq (bwd all-gather).
Per block that is the same traffic as the all-reduces it replaces.

Two more pieces make it exact:
- the first block's input is split from the replicated embeddings (split_to_region: fwd local
  chunk, bwd all-gather), or, when the caller embeds the ids itself (the ds_hetero language
  stage), the vocab-parallel embedding reduce-scatters its partial lookups straight onto the
  chunks (embedding.py); the decoder's output stays S(seq): the vocab-parallel head gathers it
  (all-gather, bwd reduce-scatter);
- replicated parameters used on sequence shards (norm weights, row-parallel biases) see only
  their shard's tokens: a gradient hook sums their gradients over tp, so every rank holds the
  full, identical gradient, as without sequence parallelism. They are tagged
  `sequence_parallel=True` (Megatron's attribute) for whoever inspects them.

The sequence length must be divisible by tp (a ValueError before any communication).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..comm import split_to_region


class SplitSequenceHook:
    """Forward pre-hook of the first decoder block: keep this rank's sequence chunk."""

    def __init__(self, group, seq_dim: int = 1):
        self.group, self.seq_dim = group, seq_dim

    def __call__(self, module, args, kwargs):
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": split_to_region(kwargs["hidden_states"], self.seq_dim, self.group)}
        return (split_to_region(args[0], self.seq_dim, self.group), *args[1:]), kwargs


def add_grad_hook(param: nn.Parameter, hook) -> None:
    """Register a gradient hook and list it on the parameter (`grad_hooks`): a parameter replaced
    by a new tensor later (per-shard loading, weights/materialize.py) gets the same hooks."""
    param.grad_hooks = (*getattr(param, "grad_hooks", ()), hook)
    param.register_hook(hook)


class SumGradOverGroup:
    """Tensor hook: the gradient summed over the group (a new tensor; the incoming one is untouched)."""

    def __init__(self, group):
        self.group = group

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        total = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(total, group=self.group)
        return total


def apply_sequence_parallel(decoder: nn.Module, group, seq_dim: int = 1, split_input: bool = True) -> None:
    """Split the sequence before `decoder.layers[0]` and sum replicated grads in layers and final norm.

    The decoder's regions must already be sharded with `sequence_parallel=True`.
    `split_input=False`: the caller hands the decoder this rank's sequence chunk (the ds_hetero
    language stage: its vocab-parallel embedding reduce-scatters onto the chunks, and the boundary
    delivers per-chunk image rows). The embedding's weight is a tp shard whose gradient is exact
    on each rank (its backward all-gathers the chunks' gradients): no sum over tp for it.
    """
    if dist.get_world_size(group) == 1:
        return
    parts = [decoder.layers, decoder.norm]
    if split_input:
        decoder.layers[0].register_forward_pre_hook(SplitSequenceHook(group, seq_dim), with_kwargs=True)
    hook = SumGradOverGroup(group)
    for part in parts:
        for param in part.parameters():
            if param.requires_grad and not (getattr(param, "tensor_model_parallel", False)
                                            or getattr(param, "tp_partial_grad", False)):
                param.sequence_parallel = True
                add_grad_hook(param, hook)
