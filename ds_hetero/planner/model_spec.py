"""The shapes the cost model needs, read from a Hugging Face config (no weights, no torch).

    spec = model_spec(config)          # Llava, Qwen2-VL, Qwen2.5-VL or Gemma 3 configs (objects or their dicts)

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

    kind               "clip", "siglip", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl", "llava_onevision" or "gemma3" (SigLIP + pooling)
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
                       (LLaVA: linear_1, linear_2; Qwen2-VL merger: mlp.0, mlp.2; Gemma 3: one
                       bias-free projection, replicated over tp)
    merge              tower tokens per image token: Qwen's spatial_merge^2, InternVL-style
                       pixel shuffle, Gemma 3's pooling kernel^2 (the tower works per patch,
                       the boundary per merged token)
    window             tower tokens one windowed attention block attends over (Qwen2.5-VL);
                       0 = every block attends over the whole image
    full_layers        with a window: how many blocks still attend over the whole image
    gated_mlp          gate/up/down MLP (Qwen2.5-VL) instead of fc1/fc2
    rms_norms          RMSNorms (weight only) instead of LayerNorms (weight and bias)
    projector_norm     parameters of the norms before the projector(s) (Qwen merger ln_q, Gemma 3
                       mm_soft_emb_norm, Qwen3-VL's merger and DeepStack merger LayerNorms)
    deepstack          Qwen3-VL: DeepStack mergers (each the projector's linears again); the
                       boundary then carries 1 + deepstack row tensors per image token
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
    window: int = 0
    full_layers: int = 0
    gated_mlp: bool = False
    rms_norms: bool = False
    projector_norm: int = 0
    deepstack: int = 0
    layer_extra: int = 0  # per-layer parameters beyond the formula (InternViT: layer scales, no q/k/v biases)
    stem_in: int = 0  # a second embedding GEMM per tower token, [stem_in -> hidden], with input gradient
    #                   (an audio encoder's second convolution: planner/encoders.py)
    held: int = 0  # parameters held but never trained, beyond the unused tail (an audio encoder's bos/eos)
    replicated_projector: bool = False  # the projector is not split over tp (every tp rank holds it whole)

    @property
    def boundary_levels(self) -> int:
        """Row tensors the boundary carries per image token (the embedding, each DeepStack level)."""
        return 1 + self.deepstack

    def seq_per_image(self, tokens_per_image: int | None = None) -> int:
        k = self.tokens_per_image if tokens_per_image is None else tokens_per_image
        return k * self.merge + self.cls_tokens

    def layer_params(self) -> int:
        h, f = self.hidden, self.ffn
        # q, k, v, out (with biases); fc1, fc2 or gate, up, down (with biases); two norms
        mlp = 3 * h * f + 2 * f + h if self.gated_mlp else 2 * h * f + f + h
        return 4 * h * h + 4 * h + mlp + (2 if self.rms_norms else 4) * h + self.layer_extra

    def projector_params(self) -> int:
        biases = 0 if self.kind == "gemma3" else sum(o for _, o in self.projector)
        return (1 + self.deepstack) * (sum(i * o for i, o in self.projector) + biases) + self.projector_norm

    def params(self) -> int:
        """Parameters the forward touches (the tower's unused tail is excluded, as the engine does)."""
        return self.embed_params + self.layers_backward * self.layer_params() + self.projector_params()

    def attention_spans(self, seq: int) -> tuple[tuple[int, int], ...]:
        """(layers, tower tokens one attention call spans) for an image of `seq` tower tokens."""
        if not self.window or self.window >= seq:
            return ((self.layers_forward, seq),)
        return ((self.full_layers, seq), (self.layers_forward - self.full_layers, self.window))

    def untrained_params(self) -> int:
        """Parameters the tower holds that no gradient reaches (layers after LLaVA's feature layer,
        the post-layernorm); held in memory, not in the optimizer. (SigLIP's pooling head, when the
        config has one, is not counted.)"""
        if self.kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "internvl"):
            return 0
        if self.held:
            return self.held
        return (self.layers_forward - self.layers_backward) * self.layer_params() + 2 * self.hidden

    def projector_replicated_params(self) -> int:
        """The projector's part of `replicated_params` (its row-parallel biases, the Qwen / InternVL
        norms before it; all of it when the projector is not split)."""
        if self.kind == "gemma3" or self.replicated_projector:
            return self.projector_params()
        extra = self.projector_norm if self.kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl") else 0
        return (1 + self.deepstack) * self.projector[-1][1] + extra

    def projector_params_per_rank(self, tp: int) -> float:
        """The projector's parameters on one tp rank (the rest of `ModelSpec.params_per_rank("vision", tp)`
        is the tower's: a frozen tower's share, planner/frozen.py)."""
        if tp == 1:
            return self.projector_params()
        whole = self.projector_replicated_params()
        return (self.projector_params() - whole) / tp + whole

    def replicated_params(self) -> int:
        """Parameters every tp rank holds whole: embeddings, norms, the biases of row-parallel linears
        (added after the reduction); everything else is split over tp."""
        h = self.hidden
        per_layer = (2 if self.rms_norms else 4) * h + 2 * h  # two norms; out and fc2 / down biases
        return self.embed_params + self.layers_backward * per_layer + self.projector_replicated_params()


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
    extra_layer_norms: int = 0  # Gemma 3: pre/post-feedforward norms (2 h) and q/k norms (2 head_dim)

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        q = self.heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        return attn + 3 * h * self.ffn + 2 * h + self.extra_layer_norms  # gate, up, down; two RMSNorms

    def params(self) -> int:
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * self.layer_params() + self.hidden + head

    def vocab_params(self, tp: int = 1) -> int:
        """The input embedding and the head (one matrix when tied) on one tp rank: both are split on the
        vocabulary, ceil(vocab / tp) rows each (the last shard padded with zero rows)."""
        rows = -(-self.vocab // tp)
        return rows * self.hidden * (1 if self.tied else 2)

    def replicated_params(self) -> int:
        """Parameters every tp rank holds whole: the norms (a Qwen3 / Gemma 3 layer's q and k norms too)."""
        return (2 * self.layers + 1) * self.hidden + self.layers * self.extra_layer_norms

    def params_per_rank(self, tp: int) -> int:
        """One tp rank's parameters: the layers' split weights / tp, the vocabulary shards, the norms."""
        if tp == 1:
            return self.params()
        split = self.params() - self.vocab_params() - self.replicated_params()
        return split // tp + self.vocab_params(tp) + self.replicated_params()


@dataclass(frozen=True)
class ModelSpec:
    family: str  # "llava", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl", "llava_onevision" or "gemma3"
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
        projector=((merged, merged), (merged, _get(v, "hidden_size"))), projector_norm=2 * e,
        embed_params=patch_in * e,  # a Conv3d without bias; rotary positions have no parameters
    ), _language(text, cfg))


def _qwen2_5_vl(cfg: Any) -> ModelSpec:
    v, text = _get(cfg, "vision_config"), _get(cfg, "text_config") or cfg
    e, m, depth = _get(v, "hidden_size"), _get(v, "spatial_merge_size"), _get(v, "depth")
    merged = e * m * m
    patch = _get(v, "patch_size")
    patch_in = _get(v, "in_channels", 3) * _get(v, "temporal_patch_size") * patch ** 2
    side = _get(v, "window_size") // m // patch  # merged tokens per window side (the tower's rule)
    full = len({i for i in _get(v, "fullatt_block_indexes") if 0 <= i < depth})
    return ModelSpec("qwen2_5_vl", VisionSpec(
        kind="qwen2_5_vl", hidden=e, ffn=_get(v, "intermediate_size"), heads=_get(v, "num_heads"),
        layers_forward=depth, layers_backward=depth, patch_in=patch_in, tokens_per_image=0, merge=m * m,
        cls_tokens=0, projector=((merged, merged), (merged, _get(v, "out_hidden_size"))), projector_norm=e,
        embed_params=patch_in * e, window=(side * m) ** 2, full_layers=full, gated_mlp=True, rms_norms=True,
    ), _language(text, cfg))


def _qwen3_vl(cfg: Any) -> ModelSpec:
    v, text = _get(cfg, "vision_config"), _get(cfg, "text_config")
    if str(_get(cfg, "model_type", "")) == "qwen3_vl_moe":
        raise ValueError("qwen3_vl_moe: the planner has no expert-parallel axis yet (the engine trains it with "
                         "stages.language.ep; write that layout by hand)")
    e, m, depth = _get(v, "hidden_size"), _get(v, "spatial_merge_size"), _get(v, "depth")
    merged = e * m * m
    patch_in = _get(v, "in_channels", 3) * _get(v, "temporal_patch_size") * _get(v, "patch_size") ** 2
    levels = len(_get(v, "deepstack_visual_indexes"))
    heads = _get(text, "num_attention_heads")
    head_dim = _get(text, "head_dim") or _get(text, "hidden_size") // heads
    language = _language(text, cfg)
    language = LanguageSpec(**{**language.__dict__, "extra_layer_norms": 2 * head_dim})  # q_norm, k_norm
    return ModelSpec("qwen3_vl", VisionSpec(
        kind="qwen3_vl", hidden=e, ffn=_get(v, "intermediate_size"), heads=_get(v, "num_heads"),
        layers_forward=depth, layers_backward=depth, patch_in=patch_in, tokens_per_image=0, merge=m * m,
        cls_tokens=0, projector=((merged, merged), (merged, _get(v, "out_hidden_size"))),
        # the merger's LayerNorm over e, each DeepStack merger's over the merged width
        projector_norm=2 * e + levels * 2 * merged, deepstack=levels,
        # a Conv3d with bias and the learned position grid
        embed_params=patch_in * e + e + _get(v, "num_position_embeddings") * e,
    ), language)


def _internvl(cfg: Any) -> ModelSpec:
    v, text = _get(cfg, "vision_config"), _get(cfg, "text_config")
    size, patch = _get(v, "image_size"), _get(v, "patch_size")
    size, patch = (size if isinstance(size, int) else size[0]), (patch if isinstance(patch, int) else patch[0])
    h, th = _get(v, "hidden_size"), _get(text, "hidden_size")
    grid = (size // patch) ** 2
    shuffle = int(round(1 / _get(cfg, "downsample_ratio", 0.5))) ** 2  # patches folded into one token
    layers = _get(v, "num_hidden_layers")
    feature = _get(cfg, "vision_feature_layer", -1)
    deepest = feature if feature >= 0 else layers + 1 + feature
    qkv_bias = bool(_get(v, "attention_bias", False))
    qk_norm = 2 * h if _get(v, "use_qk_norm", False) else 0
    final_norm = 0 if _get(v, "use_mean_pooling", True) else 2 * h
    return ModelSpec("internvl", VisionSpec(
        kind="internvl", hidden=h, ffn=_get(v, "intermediate_size"), heads=_get(v, "num_attention_heads"),
        layers_forward=layers, layers_backward=deepest, patch_in=_get(v, "num_channels", 3) * patch ** 2,
        tokens_per_image=_get(cfg, "image_seq_length"), merge=shuffle,
        cls_tokens=int(_get(cfg, "vision_feature_select_strategy", "default") == "default"),
        projector=((h * shuffle, th), (th, th)), projector_norm=2 * h * shuffle,
        # no q/k/v biases unless attention_bias; two layer scales (lambda_1, lambda_2); optional q/k norms
        layer_extra=(0 if qkv_bias else -3 * h) + 2 * h + qk_norm,
        # patch conv with bias, CLS token, grid + 1 positions, the final norm (Identity with mean pooling)
        embed_params=_get(v, "num_channels", 3) * patch ** 2 * h + h + h + (grid + 1) * h + final_norm,
    ), _language(text, cfg))


def _llava_onevision(cfg: Any) -> ModelSpec:
    """SigLIP tiles + projector; the image-token count varies with the image (any resolution), so,
    as for Qwen2-VL, the planner's --image-tokens sets it (one row per tile patch, before unpadding)."""
    v, text = _get(cfg, "vision_config"), _get(cfg, "text_config")
    spec = _llava({**({k: _get(cfg, k) for k in ("vision_feature_layer", "vision_feature_select_strategy")}),
                   "vision_config": v, "text_config": text})
    vision = VisionSpec(**{**spec.vision.__dict__, "kind": "llava_onevision", "tokens_per_image": 0,
                           "cls_tokens": 0, "projector_norm": _get(text, "hidden_size")})  # + image_newline
    return ModelSpec("llava_onevision", vision, spec.language)


def _gemma3(cfg: Any) -> ModelSpec:
    v, text = _get(cfg, "vision_config"), _get(cfg, "text_config")
    vh, th = _get(v, "hidden_size"), _get(text, "hidden_size")
    grid = (_get(v, "image_size") // _get(v, "patch_size")) ** 2
    tokens = _get(cfg, "mm_tokens_per_image", 256)
    layers = _get(v, "num_hidden_layers")
    heads = _get(text, "num_attention_heads")
    head_dim = _get(text, "head_dim") or th // heads
    language = _language(text, cfg)
    language = LanguageSpec(**{**language.__dict__, "extra_layer_norms": 2 * th + 2 * head_dim})
    return ModelSpec("gemma3", VisionSpec(
        kind="gemma3", hidden=vh, ffn=_get(v, "intermediate_size"), heads=_get(v, "num_attention_heads"),
        layers_forward=layers, layers_backward=layers, patch_in=_get(v, "num_channels", 3) * _get(v, "patch_size") ** 2,
        tokens_per_image=tokens, merge=grid // tokens, cls_tokens=0, projector=((vh, th),), projector_norm=vh,
        # SigLIP: conv with bias, grid positions; its post-layernorm runs before the pooling
        embed_params=_get(v, "num_channels", 3) * _get(v, "patch_size") ** 2 * vh + vh + grid * vh + 2 * vh,
    ), language)


def model_spec(cfg: Any) -> ModelSpec:
    """The spec of a LLaVA or Qwen2-VL config (a transformers config object or its dict)."""
    model_type = str(_get(cfg, "model_type", ""))
    if model_type == "llava":
        return _llava(cfg)
    if model_type == "qwen2_vl":
        return _qwen2_vl(cfg)
    if model_type == "qwen2_5_vl":
        return _qwen2_5_vl(cfg)
    if model_type == "gemma3":
        return _gemma3(cfg)
    if model_type in ("qwen3_vl", "qwen3_vl_moe"):
        return _qwen3_vl(cfg)
    if model_type == "internvl":
        return _internvl(cfg)
    if model_type == "llava_onevision":
        return _llava_onevision(cfg)
    raise ValueError(f"the planner knows llava, qwen2_vl, qwen2_5_vl, qwen3_vl, internvl, llava_onevision and gemma3 configs, got model_type {model_type!r}")
