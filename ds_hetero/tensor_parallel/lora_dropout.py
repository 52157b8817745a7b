"""PEFT's `lora_dropout` under tensor parallelism: the mask drawn from the stage's model-parallel RNG (rng.py).

A LoRA layer computes  y = base(x) + B(A(dropout(x))) * s. On a column-parallel base the input x is
replicated over the tp group and every rank applies its own B rows to A(dropout(x)): the ranks
must drop the same entries, so the mask comes from the stage's replicated stream. On a
row-parallel base x is this rank's slice of the input features and A is split the same way: each
slice may take its own mask, from the sharded stream. Either way the layer is one LoRA layer with
one dropout mask over its full input, as in a single process (only which mask is drawn differs:
the default generator's there, the stage's stream here).

Installed in place of PEFT's `nn.Dropout` on the LoRA layers tensor parallelism sharded (a stage
with tp = 1 keeps PEFT's own dropout and torch's default generator, as a stock run does).
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import ColumnParallelLinear, RowParallelLinear
from .lora import is_lora_layer


class TensorParallelDropout(nn.Module):
    """`nn.Dropout(p)` drawing its mask from a StageRNG stream (replicated or sharded over tp)."""

    def __init__(self, p: float, rng, sharded: bool):
        super().__init__()
        self.p, self.rng, self.sharded = float(p), rng, bool(sharded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=self.rng.generator(x.device, self.sharded))
        # scaled as F.dropout scales (1 / (1 - p)); p = 1 drops everything
        return x * keep.mul_(0.0 if self.p >= 1.0 else 1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}, stream={'sharded' if self.sharded else 'replicated'}"


def install_lora_dropout(module: nn.Module, rng) -> int:
    """Replace the dropout of every tp-sharded LoRA layer in `module` whose `lora_dropout` is > 0;
    returns how many were replaced."""
    count = 0
    for layer in module.modules():
        if not is_lora_layer(layer) or not isinstance(layer.base_layer, (ColumnParallelLinear, RowParallelLinear)):
            continue
        sharded = isinstance(layer.base_layer, RowParallelLinear)
        for name, dropout in list(layer.lora_dropout.items()):
            if isinstance(dropout, nn.Dropout) and dropout.p > 0:
                layer.lora_dropout[name] = TensorParallelDropout(dropout.p, rng, sharded)
                count += 1
    return count


def uses_stage_rng(module: nn.Module) -> bool:
    return any(isinstance(m, TensorParallelDropout) for m in module.modules())


def stage_rng(module: nn.Module, stage: str, coord, seed: int):
    """The stage's StageRNG with its LoRA dropouts drawing from it, or None where it has none to serve."""
    from .rng import StageRNG

    rng = StageRNG(seed, stage, coord)
    return rng if install_lora_dropout(module, rng) else None
