"""Attention inside packed rows under a dense kernel (sdpa, eager): each sample's own, called per sample.

With packed `position_ids` and no mask, transformers builds a block-diagonal causal mask and a
dense kernel scores the row's whole L x L through it: one row of n samples costs the attention of
their total length squared, nearly all of it masked. Flash-attention's varlen kernel computes each
sample's own block instead; sdpa and eager have no such entry. So for them the language stage
calls the model's own kernel once per sample (`packed_segments`: the row's sample lengths, known on
the host), causal inside the sample: the same function as the block-diagonal mask, at the cost of
the samples' own attention, and one packed row per rank needs no padding (step/rows.py cuts rows
only for `row_mask`). Not a kernel of ours: each call is transformers' sdpa (or the model file's
eager) on a slice of q, k, v. Nor is the mask built: the decoder gets `segments_mask`, an empty
4-D mask that transformers passes through untouched.

How it is hooked into Hugging Face: as context_parallel/attention.py, through the process-wide
attention registry, by name (one stateless entry per inner kernel, `KERNELS`); each attention
module of the language decoder gets a shallow copy of the decoder's config naming the entry. The
decoder's own config keeps its kernel, so its mask code is unchanged, and a call without
`packed_segments` (the samples cut, the user's own forward of the model) gets exactly the inner
kernel on the mask the decoder built for it.

`packed_segments` reaches the kernel as a keyword of the decoder's forward: transformers passes a
decoder's extra keywords down to every attention call (the families here all do; the packing tests
fail without it), and activation recompute replays them. Under sequence shards the kernel sees
whole rows (Ulysses gathers the sequence for a share of the heads; sequence parallelism alone
gathers it before attention), so the lengths are those of whole rows.

A sample's mask beyond causal comes with it: a sliding-window layer (the `sliding_window` its
attention module hands every kernel call) gets the window inside each sample, built here; a family
whose decoder builds more than causal and window masks (Gemma 3 and 4: each image's tokens attend to
each other both ways) hands the masks it builds for each sample alone as `packed_masks`
(models/sample_masks.py), picked by the attention module's `layer_type`.
"""

from __future__ import annotations

import copy
import sys
from typing import Callable, Sequence

import torch
from torch import nn

from ..errors import HeteroConfigError

PER_SAMPLE, ROW_MASK, KERNEL = "per_sample", "row_mask", "kernel"
DENSE_KERNELS = (None, "eager", "sdpa")  # they score a packed row's whole L x L under its mask
# the registered entries, by the kernel they call per sample
KERNELS = {"sdpa": "ds_hetero_per_sample_sdpa", "eager": "ds_hetero_per_sample_eager"}
FIELD = "hetero_parallel.packed_attention"


def packed_attention_mode(text_config, choice: str | None) -> str:
    """How this decoder attends inside packed rows, for `hetero_parallel.packed_attention` = choice:
    PER_SAMPLE (this module's kernel), ROW_MASK (the whole row under transformers' block-diagonal mask,
    rows cut for it: step/rows.py) or KERNEL (the model's kernel already scores each sample alone:
    flash-attention varlen, flex attention). Pure; a choice the decoder cannot take raises by name."""
    kernel = getattr(text_config, "_attn_implementation", None)
    if kernel not in DENSE_KERNELS:
        if choice == ROW_MASK:
            raise HeteroConfigError(FIELD, f"\"row_mask\" applies to the dense kernels sdpa and eager; the model's "
                                           f"attention kernel {kernel!r} scores each sample of a packed row alone "
                                           "already; remove the key")
        return KERNEL
    if choice == ROW_MASK:
        return ROW_MASK
    return PER_SAMPLE  # sliding-window layers too: the window is applied inside each sample (`_sample_mask`)


def require_per_sample(mode: str, kernel: str | None, family: str, why: str) -> None:
    """Refuse packed rows attended otherwise than per sample (`mode`, from packed_attention_mode), for a
    family whose samples need what only the per-sample path hands the decoder (`why`), naming the field."""
    if mode != PER_SAMPLE:
        raise HeteroConfigError(FIELD, f"{family} packs with per-sample attention only (here {mode!r}, attention "
                                       f"kernel {kernel!r}): {why}; load the model with attn_implementation "
                                       "\"sdpa\" or \"eager\" and remove packed_attention, or use language_batching "
                                       "\"samples\"")


# the attribute that holds an attention module's own eager function (each model file has its own),
# set by `apply_per_sample_attention`; read through attribute access, since under sequence shards
# the kernel may be handed a view of the module (context_parallel/attention.py `_GroupsView`)
EAGER = "ds_hetero_eager_attention"


def _inner(module: nn.Module, name: str) -> Callable:
    """The kernel the module would have used."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return getattr(module, EAGER) if name == "eager" else ALL_ATTENTION_FUNCTIONS[name]


def _causal(n: int, like: torch.Tensor, window: int | None = None, additive: bool = True) -> torch.Tensor:
    """One sample's causal mask [1, 1, n, n], inside a sliding window of `window` positions if given
    (position q sees k for q - window < k <= q: transformers' `sliding_window_overlay`): eager's
    additive mask, or sdpa's boolean one (True: attend)."""
    q = torch.arange(n, device=like.device)
    seen = (q[None, :] <= q[:, None])
    if window is not None:
        seen &= q[None, :] > q[:, None] - window
    if not additive:
        return seen[None, None]
    return torch.zeros((n, n), dtype=like.dtype, device=like.device).masked_fill_(
        ~seen, torch.finfo(like.dtype).min)[None, None]


def _sample_mask(name: str, n: int, like: torch.Tensor, window: int | None) -> torch.Tensor | None:
    """The mask of one sample of `n` positions where the family gives none of its own: causal, inside
    the layer's sliding window; None where sdpa's causal flag alone is exact."""
    if window is not None and n <= window:
        window = None  # the window holds the whole sample: plain causal
    if name == "eager":
        return _causal(n, like, window)
    return None if window is None else _causal(n, like, window, additive=False)


def _masks_of(module, packed_masks):
    """This layer's masks in `packed_masks` ({layer type: [row][segment] mask or None}), by the attention
    module's `layer_type` (Gemma: "sliding_attention", "full_attention"); None without packed_masks."""
    if packed_masks is None:
        return None
    kind = getattr(module, "layer_type", None)
    if kind not in packed_masks:
        raise ValueError(f"packed_masks hold {sorted(packed_masks)} but {type(module).__name__} is a {kind!r} layer")
    return packed_masks[kind]


def segments_mask(hidden: torch.Tensor) -> torch.Tensor:
    """The decoder's `attention_mask` for packed rows attended per sample: an empty 4-D mask
    [b, 1, 0, 0]. transformers hands a 4-D mask to the kernel as it is, so no [L, L] mask is built
    (O(L^2) memory per row: a gigabyte at 32k tokens); the per-sample kernel does not read it, and
    any other kernel fails on its shape instead of attending across samples."""
    return torch.zeros((hidden.shape[0], 1, 0, 0), dtype=torch.bool, device=hidden.device)


def _per_sample(name: str) -> Callable:
    def attend(module, query, key, value, attention_mask, packed_segments: Sequence[Sequence[int]] | None = None,
               packed_masks=None, **kwargs):
        inner = _inner(module, name)
        if packed_segments is None:  # not a packed micro-batch: the decoder built the mask
            return inner(module, query, key, value, attention_mask, **kwargs)
        kwargs.pop("is_causal", None)
        if name != "eager":
            kwargs["is_causal"] = True  # sdpa without a mask: causal (its flash / cuDNN kernels on a GPU)
        window = kwargs.get("sliding_window")  # this layer's window (None: full attention)
        given = _masks_of(module, packed_masks)
        masks: dict[int, torch.Tensor | None] = {}  # the masks built here depend on the length alone
        rows = []
        for r, lengths in enumerate(packed_segments):
            parts, start = [], 0
            for i, n in enumerate(lengths):
                if n == 0:  # an empty sample holds no position: nothing to attend (the kernels refuse 0 rows)
                    continue
                q, k, v = (t[r:r + 1, :, start:start + n] for t in (query, key, value))
                own = None if given is None else given[r][i]
                if own is None and n not in masks:
                    masks[n] = _sample_mask(name, n, query, window)
                out, _ = inner(module, q, k, v, masks[n] if own is None else own, **kwargs)
                parts.append(out)
                start += n
            if start != query.shape[2]:
                raise ValueError(f"packed_segments of row {r} cover {start} positions, the row has {query.shape[2]}")
            rows.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=1))  # a row holds >= 1 position
        return (rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)), None

    attend.__name__ = KERNELS[name]
    return attend


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    for inner, entry in KERNELS.items():
        if entry not in ALL_ATTENTION_FUNCTIONS:  # idempotent: the functions hold no state
            AttentionInterface.register(entry, _per_sample(inner))


def calls_per_sample(module: nn.Module) -> bool:
    """Whether `module` is an attention module that calls a per-sample entry (directly, or as the
    inner kernel of context_parallel/attention.py's wrapper)."""
    if not type(module).__name__.endswith("Attention"):
        return False
    wrapper = getattr(module, "ds_hetero_sequence_attention", None)
    kernel = (wrapper.inner_name if wrapper is not None
              else getattr(getattr(module, "config", None), "_attn_implementation", None))
    return kernel in KERNELS.values()


def apply_per_sample_attention(decoder: nn.Module) -> int:
    """Point every submodule of `decoder` that reads the decoder's config (its attention modules
    and their layers) at the per-sample entry of the decoder's kernel, through one shallow copy of
    that config; returns how many attention modules call it (a decoder with none raises)."""
    _register()
    config = decoder.config
    kernel = config._attn_implementation or "sdpa"
    own = copy.copy(config)  # the decoder's config (its mask code, save_pretrained) is untouched
    own._attn_implementation_internal = KERNELS[kernel]
    for module in decoder.modules():
        if module is not decoder and getattr(module, "config", None) is config:
            module.config = own
        if kernel == "eager" and type(module).__name__.endswith("Attention"):  # its model file's own eager
            eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
            if eager is not None:
                setattr(module, EAGER, eager)
    attention = sum(map(calls_per_sample, decoder.modules()))
    if not attention:
        raise HeteroConfigError(FIELD, f"no attention module of {type(decoder).__name__} reads the decoder's config; "
                                       "use \"row_mask\"")
    return attention


__all__ = ["DENSE_KERNELS", "KERNEL", "KERNELS", "PER_SAMPLE", "ROW_MASK", "apply_per_sample_attention",
           "calls_per_sample", "packed_attention_mode", "require_per_sample", "segments_mask"]
