"""The shapes the cost model needs, read from a Hugging Face config (no weights, no torch).

    spec = model_spec(config)          # LlavaConfig or Qwen2VLConfig (objects or their dicts)

A `VisionSpec` describes the tower and projector per image, a `LanguageSpec` the decoder and
head per token. Parameter counts are computed from the shapes by hand (the tests compare them
with a model built on the meta device), so a 70B config costs nothing to plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


@dataclass(frozen=True)
class VisionSpec:
    """A ViT tower plus projector.

    kind               "clip", "siglip" or "qwen2_vl"
    tokens_per_image   image tokens one image gives the language model (LLaVA: fixed by the
                       image size; Qwen2-VL: variable, set by the planner's --image-tokens)
    seq_per_image      tokens inside the tower per image (CLIP adds a CLS token; Qwen2-VL sees
                       spatial_merge^2 patches per image token). Attention is full over one
                       image in both families: LLaVA's CLIP/SigLIP and Qwen2-VL's tower (which
                       has no windowed attention, unlike Qwen2.5-VL) attend within an image.
    layers_forward     layers the forward runs (HF runs the whole tower even when LLaVA takes
                       an earlier layer's output)
    layers_backward    layers a gradient reaches (up to LLaVA's deepest feature layer)
    patch_in           inputs of the patch embedding per tower token (channels x patch area
                       [x temporal patch])
    projector          (in, out) of each linear applied per image token after the tower
                       (LLaVA: linear_1, linear_2; Qwen2-VL merger: mlp.0, mlp.2)
    """

    kind: str
    hidden: int
    ffn: int
    heads: int
    layers_forward: int
    layers_backward: int
    patch_in: int
    tokens_per_image: int
    merge: int  # tower tokens per image token (Qwen2-VL spatial_merge_size^2; 1 for LLaVA)
    cls_tokens: int  # extra tower tokens per image (CLIP's CLS)
    projector: tuple[tuple[int, int], ...]
    embed_params: int  # patch embedding, position embeddings, CLS, pre-norm

    def seq_per_image(self, tokens_per_image: int | None = None) -> int:
        k = self.tokens_per_image if tokens_per_image is None else tokens_per_image
        return k * self.merge + self.cls_tokens

    def layer_params(self) -> int:
        h, f = self.hidden, self.ffn
        # q, k, v, out (with biases), fc1, fc2 (with biases), two norms (weight + bias)
        return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h

    def params(self) -> int:
        """Parameters the forward touches (the tower's unused tail is excluded, as the engine does)."""
        proj = sum(i * o + o for i, o in self.projector)
        if self.kind == "qwen2_vl":
            proj += 2 * self.hidden  # the merger's ln_q
        return self.embed_params + self.layers_backward * self.layer_params() + proj

    def untrained_params(self) -> int:
        """Parameters the tower holds that no gradient reaches (layers after LLaVA's feature layer,
        the post-layernorm); held in memory, not in the optimizer. (SigLIP's pooling head, when the
        config has one, is not counted.)"""
        if self.kind == "qwen2_vl":
            return 0
        return (self.layers_forward - self.layers_backward) * self.layer_params() + 2 * self.hidden

    def replicated_params(self) -> int:
        """Parameters every tp rank holds whole: embeddings, norms, the biases of row-parallel linears
        (added after the reduction); everything else is split over tp."""
        h = self.hidden
        per_layer = 4 * h + 2 * h  # two norms; out and fc2 biases
        extra = 2 * h if self.kind == "qwen2_vl" else 0  # the merger's ln_q
        return self.embed_params + self.layers_backward * per_layer + self.projector[-1][1] + extra


@dataclass(frozen=True)
class LanguageSpec:
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    tied: bool
    qkv_bias: bool  # Qwen2 has q/k/v biases, Llama not

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        q = self.heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        return attn + 3 * h * self.ffn + 2 * h  # gate, up, down; two RMSNorms

    def params(self) -> int:
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * self.layer_params() + self.hidden + head

    def vocab_params(self, tp: int = 1) -> int:
        """The input embedding and the head (one matrix when tied) on one tp rank: both are split on the
        vocabulary, ceil(vocab / tp) rows each (the last shard padded with zero rows)."""
        rows = -(-self.vocab // tp)
        return rows * self.hidden * (1 if self.tied else 2)

    def replicated_params(self) -> int:
        """Parameters every tp rank holds whole: the norms."""
        return (2 * self.layers + 1) * self.hidden

    def params_per_rank(self, tp: int) -> int:
        """One tp rank's parameters: the layers' split weights / tp, the vocabulary shards, the norms."""
        if tp == 1:
            return self.params()
        split = self.params() - self.vocab_params() - self.replicated_params()
        return split // tp + self.vocab_params(tp) + self.replicated_params()


@dataclass(frozen=True)
class ModelSpec:
    family: str  # "llava" or "qwen2_vl"
    vision: VisionSpec
    language: LanguageSpec

    def stage_params(self, stage: str) -> int:
        return self.vision.params() if stage == "vision" else self.language.params()

    def params_per_rank(self, stage: str, tp: int) -> float:
        """Parameters one tp rank of the stage holds: the split ones / tp plus the replicated ones."""
        if stage == "language":
            return self.language.params_per_rank(tp)
        s = self.vision
        whole = s.replicated_params() if tp > 1 else 0
        return (s.params() - whole) / tp + whole


def chunk_params_per_rank(spec: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> float:
    """Parameters one tp rank of a language pipeline stage holds: its decoder layers, the input
    embedding (first stage) and the final norm and head (last stage), embedding and head split on
    the vocabulary (a tied matrix counted once when one stage holds both).
    With every layer, first and last it equals params_per_rank("language", tp)."""
    lm = spec.language
    h = lm.hidden
    norms = 2 * h if tp > 1 else 0
    layer = (lm.layer_params() - norms) / tp + norms
    rows = -(-lm.vocab // tp)  # ceil(vocab / tp): the vocabulary shard of the embedding and of the head
    head = (0 if lm.tied and first else rows * h) + h
    return layers * layer + (rows * h if first else 0) + (head if last else 0)


def _language(text: Any, cfg: Any) -> LanguageSpec:
    """`cfg`: the whole model's config; transformers 5 keeps `tie_word_embeddings` there (older
    checkpoints in the text config)."""
    hidden = _get(text, "hidden_size")
    heads = _get(text, "num_attention_heads")
    model_type = _get(text, "model_type", "")
    return LanguageSpec(
        hidden=hidden, ffn=_get(text, "intermediate_size"), heads=heads,
        kv_heads=_get(text, "num_key_value_heads") or heads,
        head_dim=_get(text, "head_dim") or hidden // heads, layers=_get(text, "num_hidden_layers"),
        vocab=_get(text, "vocab_size"),
        tied=bool(_get(cfg, "tie_word_embeddings", False) or _get(text, "tie_word_embeddings", False)),
        qkv_bias=str(model_type).startswith("qwen2"),
    )


def _llava(cfg: Any) -> ModelSpec:
    v, text = _get(cfg, "vision_config"), _get(cfg, "text_config")
    kind = str(_get(v, "model_type", "clip_vision_model"))
    kind = "siglip" if kind.startswith("siglip") else "clip"
    layers = _get(v, "num_hidden_layers")
    feature = _get(cfg, "vision_feature_layer", -2)
    wanted = [feature] if isinstance(feature, int) else list(feature)
    deepest = max(k if k >= 0 else layers + 1 + k for k in wanted)  # hidden_states[k]: after k layers
    grid = (_get(v, "image_size") // _get(v, "patch_size")) ** 2
    has_cls = kind == "clip"
    keeps_cls = has_cls and _get(cfg, "vision_feature_select_strategy", "default") == "full"
    vh, th = _get(v, "hidden_size"), _get(text, "hidden_size")
    return ModelSpec("llava", VisionSpec(
        kind=kind, hidden=vh, ffn=_get(v, "intermediate_size"), heads=_get(v, "num_attention_heads"),
        layers_forward=layers, layers_backward=deepest,
        patch_in=_get(v, "num_channels", 3) * _get(v, "patch_size") ** 2,
        tokens_per_image=grid + int(keeps_cls), merge=1, cls_tokens=int(has_cls and not keeps_cls),
        projector=((vh * len(wanted), th), (th, th)),
        # CLIP: conv without bias, CLS, grid + 1 positions, pre-layernorm; SigLIP: conv with bias, grid positions
        embed_params=(_get(v, "num_channels", 3) * _get(v, "patch_size") ** 2 * vh
                      + ((vh + (grid + 1) * vh + 2 * vh) if has_cls else (vh + grid * vh))),
    ), _language(text, cfg))


def _qwen2_vl(cfg: Any) -> ModelSpec:
    v, text = _get(cfg, "vision_config"), _get(cfg, "text_config") or cfg
    e, m = _get(v, "embed_dim"), _get(v, "spatial_merge_size")
    merged = e * m * m
    depth = _get(v, "depth")
    patch_in = _get(v, "in_chans", _get(v, "in_channels", 3)) * _get(v, "temporal_patch_size") * _get(v, "patch_size") ** 2
    return ModelSpec("qwen2_vl", VisionSpec(
        kind="qwen2_vl", hidden=e, ffn=int(e * _get(v, "mlp_ratio")), heads=_get(v, "num_heads"),
        layers_forward=depth, layers_backward=depth,
        patch_in=patch_in, tokens_per_image=0, merge=m * m, cls_tokens=0,
        projector=((merged, merged), (merged, _get(v, "hidden_size"))),
        embed_params=patch_in * e,  # a Conv3d without bias; rotary positions have no parameters
    ), _language(text, cfg))


def model_spec(cfg: Any) -> ModelSpec:
    """The spec of a LLaVA or Qwen2-VL config (a transformers config object or its dict)."""
    model_type = str(_get(cfg, "model_type", ""))
    if model_type == "llava":
        return _llava(cfg)
    if model_type == "qwen2_vl":
        return _qwen2_vl(cfg)
    raise ValueError(f"the planner knows llava and qwen2_vl configs, got model_type {model_type!r}")
