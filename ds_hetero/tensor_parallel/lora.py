"""LoRA (PEFT `lora.Linear`) layers under tensor parallelism, split consistently with their base layer.

A LoRA layer computes  y = base(x) + B(A(x)) * s  (A: [r, in], B: [out, r]). Where the plan shards
the base layer, the adapter is split so that the layer's output and every gradient are exact:

    column-parallel base (output features split, input x replicated):
        B split on its output rows like the base weight (same stride); A replicated. Each rank's
        A gradient is a partial sum (its B rows only): a gradient hook sums it over tp, so every
        rank holds the full, identical gradient; the x gradient stays partial, as the base
        layer's, and the region's entry sums both
    row-parallel base (input features split, output reduced):
        A split on its input columns and reduced like the base (a RowParallelLinear: the r-wide
        partial sums are all-reduced, r values per token); B replicated, applied to the reduced
        A x, so its gradient is already full and identical on every rank

Both reuse the tp layer classes, so the shard tags (dim, stride, full size) let checkpoints and
`save_pretrained` gather the adapter like any tp weight. `lora_dropout` on a sharded layer draws
its mask from the stage's model-parallel RNG (lora_dropout.py): the same mask on every tp rank
where the input is replicated (column-parallel), a mask per shard where it is split (row-parallel).
Not supported (refused by lora_checks.check_lora before any collective): LoRA variants (DoRA), a
LoRA layer tensor parallelism does not plan (e.g. the LM head) in a stage with tp > 1, sequence
parallelism, and PEFT's `modules_to_save` copies.
"""

from __future__ import annotations

from torch import nn

from .layers import ColumnParallelLinear, RowParallelLinear
from .sequence_parallel import SumGradOverGroup


def is_lora_layer(module: nn.Module) -> bool:
    return hasattr(module, "base_layer") and isinstance(getattr(module, "lora_A", None), nn.ModuleDict)


def shard_lora_column(layer: nn.Module, group, stride: int = 1) -> None:
    layer.base_layer = ColumnParallelLinear.from_linear(layer.base_layer, group, stride)
    for name in list(layer.lora_B):
        layer.lora_B[name] = ColumnParallelLinear.from_linear(layer.lora_B[name], group, stride)
    hook = SumGradOverGroup(group)
    for a in layer.lora_A.values():
        for p in a.parameters():
            if p.requires_grad:
                p.register_hook(hook)


def shard_lora_row(layer: nn.Module, group, sequence_parallel: bool = False, seq_dim: int = 1) -> None:
    layer.base_layer = RowParallelLinear.from_linear(layer.base_layer, group, sequence_parallel, seq_dim)
    for name in list(layer.lora_A):
        layer.lora_A[name] = RowParallelLinear.from_linear(layer.lora_A[name], group, sequence_parallel, seq_dim)
