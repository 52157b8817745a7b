"""Activation recompute per stage (`stages.<name>.recompute`): the first N transformer layers of a
stage (all of them for `true`) keep only their inputs in the forward and recompute the rest in
the backward.

Mechanism: transformers' own gradient checkpointing (every decoder / encoder layer of the
families here is a `GradientCheckpointingLayer`), switched on per layer with
`torch.utils.checkpoint.checkpoint(use_reentrant=False, preserve_rng_state=True)`, as
`model.gradient_checkpointing_enable({"use_reentrant": False})` does for all layers at once.
Non-reentrant: the layer's tensor-parallel, sequence-parallel and context-parallel collectives
are autograd Functions, which the non-reentrant form recomputes like any other op, and the
stage engine's `backward()` stays the only entry into autograd (DeepSpeed's ZeRO hooks see one
backward).

RNG: torch's RNG preservation, not DeepSpeed's activation checkpointing. `preserve_rng_state`
saves the CPU RNG state and that of the device the inputs live on before the layer's forward and
restores it for the recompute, so every dropout mask of the recompute is the one the forward
drew, on every rank, whatever the tp/cp layout: the result equals the run without recompute
bit for bit. DeepSpeed's `deepspeed.checkpointing` instead keeps a model-parallel RNG tracker
configured once per process from one mpu (`deepspeed.checkpointing.configure(mpu)`), which
cannot serve two stages with different tp groups in one process (colocated placement), and
only layers that fork that tracker (Megatron-style) would use it; the Hugging Face layers here
draw from the default generator, which is what torch preserves. LoRA dropout on tp-sharded layers
draws from its stage's own streams instead (tensor_parallel/rng.py): those are snapshotted in the
checkpoint's forward and restored for its recompute (`context_fn`), so it too replays its masks.

Hugging Face checkpoints a layer only in training mode (`self.training`), as the stage modules
are when training.
"""

from __future__ import annotations

import functools

import torch.utils.checkpoint
from torch import nn


def checkpoint_layers(module: nn.Module) -> list[nn.Module]:
    """The stage's transformer layers, in forward order (module order)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in module.modules() if isinstance(m, GradientCheckpointingLayer)]


def enable_recompute(module: nn.Module, layers: int, preserve_rng_state: bool = True, rng=None) -> int:
    """Recompute the first `layers` layers of `module` (-1: all); returns how many. `rng`: the stage's
    model-parallel dropout streams (tensor_parallel/rng.py), restored for the recompute as torch
    restores its default generator."""
    found = checkpoint_layers(module)
    chosen = found if layers < 0 else found[:layers]
    extra = {} if rng is None or not preserve_rng_state else {"context_fn": rng.checkpoint_contexts}
    fn = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False,
                           preserve_rng_state=preserve_rng_state, **extra)
    for layer in chosen:
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = fn
    return len(chosen)


def check_recompute(cfg, adapter) -> None:
    """Every stage with `recompute` has that many layers (pure: meta models too)."""
    from ..errors import HeteroConfigError

    for stage, module in adapter.split().items():
        want = cfg.options_of(stage).recompute
        if not want:
            continue
        have = len(checkpoint_layers(module))
        if have == 0 or want > have:
            raise HeteroConfigError(
                f"hetero_parallel.stages.{stage}.recompute",
                f"got {want}, but stage {stage!r} of {type(adapter.model).__name__} has {have} transformer layers: "
                f"use true (all) or a number up to {have}")
