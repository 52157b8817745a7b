"""Each packed sample's own attention masks, as its family's decoder builds them for the sample alone.

A decoder whose masks are more than causal and sliding-window (Gemma 3: every image's tokens attend
to each other both ways on every layer; Gemma 4: on its sliding layers) builds them from the
micro-batch's `input_ids` (LanguageStage.decoder_mask). In a packed row those masks must not reach
across samples, and the per-sample attention (per_sample_attention.py) scores each sample alone: so
the language stage calls the family's own `decoder_mask` once per sample, on that sample's ids alone
(its padding mask all ones, its positions 0..n-1), exactly what one process builds for the sample in
its own row of a padded batch, and hands the results to the kernel as the decoder keyword
`packed_masks`: {layer type: per row, per segment, the mask or None}. The kernel takes the mask of the
attention module's `layer_type`. The masks cost each sample's n x n (what its attention scores anyway),
once per forward, not per layer; no [L, L] mask of the row is built.

None where the family's masks are plain causal and sliding-window (a `decoder_mask` that returns the
padding mask, not a {layer type: mask} mapping): the kernel builds those itself from each layer's window.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def sample_masks(decoder_mask: Callable, input_ids: torch.Tensor, hidden: torch.Tensor,
                 packed_segments: Sequence[Sequence[int]]) -> dict | None:
    """{layer type: ((mask or None per segment) per row)} from `decoder_mask(ids, hidden, attention_mask,
    position_ids)` called on every non-empty segment alone (`hidden` gives its shape, dtype and device);
    None where the decoder's masks are not a mapping (module docstring). Empty segments get None."""
    built: list[list[dict | None]] = []  # per row, per segment: the decoder's {layer type: mask}
    kinds: set[str] = set()
    for r, lengths in enumerate(packed_segments):
        row, start = [], 0
        for n in lengths:
            masks = None
            if n:
                ids = input_ids[r:r + 1, start:start + n]
                positions = torch.arange(n, device=ids.device).unsqueeze(0)
                masks = decoder_mask(ids, hidden[r:r + 1, start:start + n], torch.ones_like(ids), positions)
                if not isinstance(masks, dict):
                    return None  # causal and sliding-window only: the kernel builds those per sample
                kinds.update(masks)
            row.append(masks)
            start += n
        built.append(row)
    return {kind: tuple(tuple(None if m is None else m[kind] for m in row) for row in built)
            for kind in sorted(kinds)} or None
