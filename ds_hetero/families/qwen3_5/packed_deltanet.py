"""Gated DeltaNet layers over packed rows: the convolution and the recurrence restart at every sample.

A Gated DeltaNet layer (`Qwen3_5GatedDeltaNet`, and Qwen3.5-MoE's under its own name) runs a short
causal depthwise convolution and then the gated delta-rule recurrence along the whole sequence it
is handed. Over a packed row (models/packing.py) that carries the convolution window and the
recurrent state of one sample into the next. Restarting both at every sample makes each sample's
output that of the sample alone, which is what the unpacked single-process reference computes.

Two paths, both the Hugging Face layer's own `forward` (not a reimplementation of ours):

    varlen kernels  with flash-linear-attention (`fla`) and `causal-conv1d` installed and the row on
                    a GPU: the packed rows are flattened into one sequence [1, R * L] and the layer
                    gets `cu_seq_lens_q` (its chunked delta rule takes it as `cu_seqlens`) and
                    `seq_idx` (its causal convolution's per-position sample index), which those
                    kernels take to restart at each boundary. transformers resolves those kernels
                    when the model file is imported; without them its torch fallbacks refuse both
                    keywords loudly, so this path is only taken when both import.
    torch           anywhere else (what the CPU runs): every segment of every row becomes one row
                    of a right-padded batch [S, longest] with its 2-D padding mask, and the layer
                    runs once on it. The convolution and the recurrence are causal and every batch
                    row starts from a zero state, so each valid position is exactly the sample
                    alone's (the same as the reference's right-padded batch). Cost: S x longest
                    positions instead of R x L (the layer's work, not the decoder's), one call, so
                    one tensor-parallel reduction (out_proj), as for the unpacked row.

The segments come from the decoder's `packed_segments` keyword, which transformers passes down to
every layer's token mixer (the per-sample attention passes it too: models/per_sample_attention.py);
a call without it (samples cut, the user's own forward) is the layer's own forward unchanged.
"""

from __future__ import annotations

import functools
import importlib
from typing import Sequence

import torch
from torch import nn


def is_gated_deltanet(module: nn.Module) -> bool:
    """Qwen3.5's and Qwen3.5-MoE's linear-attention token mixers (same forward, each model file's class)."""
    return type(module).__name__.endswith("GatedDeltaNet")


def has_varlen_kernels() -> bool:
    """Whether the chunked delta rule and the causal convolution that take sample boundaries import:
    the packages transformers itself resolves for this layer (integrations/hub_kernels.py)."""
    try:
        importlib.import_module("fla.ops.gated_delta_rule")
        importlib.import_module("causal_conv1d")
    except Exception:  # absent, or present without its compiled parts (no GPU build)
        return False
    return True


def check_segments(segments: Sequence[Sequence[int]], rows: int, length: int) -> None:
    if len(segments) != rows or any(sum(row) != length for row in segments):
        raise ValueError(f"packed_segments {[sum(r) for r in segments]} do not cover {rows} rows of {length} positions")


def varlen_arguments(segments: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens [S + 1] int32, seq_idx [1, R * L] int32) of the rows flattened end to end, empty
    segments dropped (they hold no position): the boundaries the varlen kernels take."""
    lengths = torch.tensor([n for row in segments for n in row if n], dtype=torch.int32)
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), lengths.long())
    return cu_seqlens.to(device), seq_idx[None].to(device)


def segments_as_batch(hidden: torch.Tensor, segments: Sequence[Sequence[int]]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch [S, longest, H]: each non-empty segment of the rows right-padded with zeros, mask
    [S, longest] long: 1 on its positions). Its positions in mask order are the rows' in order."""
    lengths = [n for row in segments for n in row if n]
    mask = torch.arange(max(lengths), device=hidden.device)[None] < torch.tensor(lengths, device=hidden.device)[:, None]
    batch = hidden.new_zeros(*mask.shape, hidden.shape[-1]).masked_scatter(mask[..., None], hidden)
    return batch, mask.long()


def segmented_forward(module: nn.Module, hidden_states: torch.Tensor, cache_params=None,
                      attention_mask: torch.Tensor | None = None,
                      packed_segments: Sequence[Sequence[int]] | None = None, use_varlen: bool | None = None,
                      kernels_installed: bool = False, **kwargs) -> torch.Tensor:
    """The layer's own forward, restarted at every segment of `packed_segments` (module docstring).
    `use_varlen`: force a path (tests); by default the varlen kernels when they are installed
    (`kernels_installed`, looked up once when the forward was given to the layer) and the row is on
    a GPU."""
    stock = type(module).forward
    if packed_segments is None:
        return stock(module, hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
    if cache_params is not None or attention_mask is not None:
        # packed rows: no cache in training, and no 2-D padding mask (the padding is a segment of its own)
        raise ValueError("a Gated DeltaNet layer over packed rows takes neither a cache nor a padding mask")
    rows, length, width = hidden_states.shape
    check_segments(packed_segments, rows, length)
    if use_varlen is None:
        use_varlen = kernels_installed and hidden_states.is_cuda
    if use_varlen:
        cu_seqlens, seq_idx = varlen_arguments(packed_segments, hidden_states.device)
        out = stock(module, hidden_states.reshape(1, rows * length, width), cu_seq_lens_q=cu_seqlens,
                    seq_idx=seq_idx, **kwargs)
        return out.reshape(rows, length, -1)
    batch, mask = segments_as_batch(hidden_states, packed_segments)
    out = stock(module, batch, attention_mask=mask, **kwargs)
    return out[mask.bool()].reshape(rows, length, -1)


def install_forward(decoder: nn.Module, forward, **keywords) -> int:
    """Every Gated DeltaNet module of `decoder` runs `forward(module, ..., **keywords)` (in place, per
    instance: the class and every other model are untouched; installing again replaces it); how many."""
    count = 0
    for module in filter(is_gated_deltanet, decoder.modules()):
        module.forward = functools.partial(forward, module, **keywords)
        count += 1
    return count


def runs_forward(module: nn.Module, forward) -> bool:
    """Whether `module` is a Gated DeltaNet layer given `forward` by `install_forward`."""
    own = module.__dict__.get("forward")
    return is_gated_deltanet(module) and isinstance(own, functools.partial) and own.func is forward


def apply_segmented_deltanet(decoder: nn.Module) -> int:
    """Give every Gated DeltaNet module of `decoder` the segmented forward (idempotent); how many."""
    # whether the kernels import, looked up once: an import attempt per call would cost every layer's forward
    return install_forward(decoder, segmented_forward, kernels_installed=has_varlen_kernels())


def restarts_per_sample(module: nn.Module) -> bool:
    """Whether `module` is a Gated DeltaNet layer that restarts at every packed sample."""
    return runs_forward(module, segmented_forward)


__all__ = ["apply_segmented_deltanet", "has_varlen_kernels", "install_forward", "is_gated_deltanet",
           "restarts_per_sample", "runs_forward",
           "segmented_forward", "segments_as_batch", "varlen_arguments"]
