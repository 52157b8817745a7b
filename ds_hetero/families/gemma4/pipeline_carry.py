"""What Gemma 4's decoder layers read besides the hidden states, carried between pipeline chunks.

- Per-layer inputs [b, s, L, d] (`hidden_size_per_layer_input` = d): Gemma4TextModel projects them from
  the merged embeddings (the encoders' rows included) and combines them with the per-layer embedding
  lookup before its first layer; layer i reads [:, :, i]. The first chunk computes them so (the
  decoder's own `project_per_layer_inputs`, on the embeddings it holds), its layers read their slice,
  and the later layers' slices travel on: past the chunk that ends before layer j, [b, s, (L - j) d].
  No later chunk could recompute them: they depend on the rows, which reach the first chunk only.
- Shared keys and values (`num_kv_shared_layers`): a layer whose `kv_sharing_modes` entry is "reuse"
  attends with the key and value the last earlier layer of its type stored ("store"), as the decoder
  hands them on in its `shared_kv_states`. Where a cut falls between the storing layer and a reusing
  one, the stored key and value ([b, kv heads, s, head_dim] each; this rank's kv heads under tp) travel
  on, flattened to [b, s, kv heads * head_dim], and the next chunk's decoder starts from them.
Both are concatenated after the hidden states (PipelineChunk), so the point-to-point exchange and its
backward (the gradient of all of it, back to the chunk that computed it) are the hidden states' own.

Every chunk's decoder takes the per-layer inputs as handed to it (its `project_per_layer_inputs` an
identity: on a later chunk the decoder's input is a hidden state, not the embeddings), and a later chunk
drops the per-layer embedding table and projection, which only the first chunk uses and holds.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

# the decoder's modules that compute the per-layer inputs: the first chunk's only
PER_LAYER_INPUT_MODULES = ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm")


def _as_given(inputs_embeds: torch.Tensor, per_layer_inputs: torch.Tensor) -> torch.Tensor:
    return per_layer_inputs


class SharedKV(NamedTuple):
    layer_type: str
    store: int  # the layer that stores it
    last_reuse: int  # the last layer that reads it


class Gemma4Carry:
    """Gemma 4's pipeline carry for the decoder `decoder` (the whole one; read when a chunk is built,
    after tensor parallelism has made its kv heads local)."""

    def __init__(self, decoder: nn.Module):
        cfg = decoder.config
        self.decoder = decoder
        self.n_layers = cfg.num_hidden_layers
        self.d = cfg.hidden_size_per_layer_input or 0
        modes = getattr(cfg, "kv_sharing_modes", None) or [None] * self.n_layers
        shared = []
        for layer_type in dict.fromkeys(cfg.layer_types):
            of_type = [i for i, t in enumerate(cfg.layer_types) if t == layer_type]
            stores = [i for i in of_type if modes[i] == "store"]
            reuses = [i for i in of_type if modes[i] == "reuse"]
            if stores and reuses:
                shared.append(SharedKV(layer_type, max(stores), max(reuses)))
        self.shared = tuple(sorted(shared, key=lambda s: s.store))

    def kv_carried(self, start: int) -> tuple[SharedKV, ...]:
        """The stored keys and values a chunk starting at layer `start` receives."""
        return tuple(s for s in self.shared if s.store < start <= s.last_reuse)

    def kv_shape(self, kv: SharedKV) -> tuple[int, int]:
        """(this rank's kv heads, head_dim) of the key and value the storing layer keeps."""
        attn = self.decoder.layers[kv.store].self_attn
        return attn.k_proj.weight.shape[0] // attn.head_dim, attn.head_dim

    def width(self, start: int) -> int:
        """Width of what the chunk before layer `start` carries past its hidden states."""
        kv = sum(2 * heads * dim for heads, dim in map(self.kv_shape, self.kv_carried(start)))
        return self.d * (self.n_layers - start) + kv

    def adjust(self, decoder: nn.Module, first: bool) -> None:
        if not self.d:
            return
        decoder.project_per_layer_inputs = _as_given  # an instance attribute of the chunk's copy only
        if not first:
            for name in PER_LAYER_INPUT_MODULES:
                decoder._modules[name] = None

    def inputs(self, embeds: torch.Tensor, extra: dict, carried: torch.Tensor | None, layers: range,
               first: bool) -> tuple[dict, tuple]:
        from transformers.cache_utils import KVSharingDict

        extra = dict(extra)
        kv = KVSharingDict()
        per_layer = None
        if first:  # the decoder's own projection, on the merged embeddings
            lookup = extra.pop("per_layer_inputs", None)
            if self.d:
                per_layer = self.decoder.project_per_layer_inputs(embeds, lookup)
        elif carried is not None:
            b, s = embeds.shape[:2]
            received = self.kv_carried(layers.start)
            widths = [self.d * (self.n_layers - layers.start)]
            shapes = [self.kv_shape(r) for r in received]
            widths += [heads * dim for heads, dim in shapes for _ in range(2)]
            pieces = carried.split(widths, dim=-1)
            if self.d:
                per_layer = pieces[0].reshape(b, s, self.n_layers - layers.start, self.d)
            for i, (r, (heads, dim)) in enumerate(zip(received, shapes, strict=True)):
                k, v = (p.reshape(b, s, heads, dim).transpose(1, 2) for p in pieces[1 + 2 * i: 3 + 2 * i])
                kv[r.layer_type] = (k, v)
        keywords = {**extra, "shared_kv_states": kv}
        if per_layer is not None:
            keywords["per_layer_inputs"] = per_layer[:, :, : len(layers)]
        return keywords, (per_layer, kv)

    def carry(self, state: tuple, layers: range) -> torch.Tensor | None:
        per_layer, kv = state
        pieces = [per_layer[:, :, len(layers):].flatten(2)] if per_layer is not None else []
        for r in self.kv_carried(layers.stop):
            pieces += [t.transpose(1, 2).flatten(2) for t in kv[r.layer_type]]
        return torch.cat(pieces, dim=-1) if pieces else None
