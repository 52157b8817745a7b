"""Each model family's shapes, read from its Hugging Face config: one function per HF `model_type`.

    READERS["qwen2_vl"](config) -> ModelSpec          # model_spec.py looks the family up here

Each reader takes the HF config (an object or its dict) and returns the plain records of
shapes.py; it reads nothing else, so it can live with the family's other parts. LLaVA with CLIP
or SigLIP, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, InternVL and Gemma 3 have one encoder
(stage "vision"); the Qwen2.5-Omni thinker two (vision, audio).

Qwen2.5-Omni's audio encoder (Whisper-like, `Qwen2_5OmniAudioEncoder`), per boundary row:

    frames      a clip of F mel frames gives rows(F) = ((F - 1) // 2 + 1 - 2) // 2 + 1 rows
                (conv2 has stride 2, the pooling after the blocks stride 2): about 4 frames a row
    tower       2 tokens per row (merge = 2), attention within chunks of n_window tokens (the
                encoder cuts the clip into chunks of 2 n_window frames before its convolutions)
    embedding   conv1 (kernel 3, n_mel -> d) on the 2 frames of each tower token: a GEMM of
                6 n_mel inputs per token without input gradient (mel features); conv2 (kernel 3,
                d -> d, stride 2): a GEMM of 3 d inputs per token, with input gradient (`stem_in`)
    layers      q, k, v, out (k without bias), fc1, fc2 (GELU), two LayerNorms
    projector   ln_post, pooling, `proj` (d -> output_dim): not split by the tp plan (replicated)
    held        `audio_bos_eos_token` (2 x output_dim): the thinker's forward never uses it
"""

from __future__ import annotations

from typing import Any

from .shapes import EncoderSpec, LanguageSpec, ModelSpec, get, language_shapes, one_encoder

def llava(cfg: Any) -> ModelSpec:
    v, text = get(cfg, "vision_config"), get(cfg, "text_config")
    kind = str(get(v, "model_type", "clip_vision_model"))
    kind = "siglip" if kind.startswith("siglip") else "clip"
    layers = get(v, "num_hidden_layers")
    feature = get(cfg, "vision_feature_layer", -2)
    wanted = [feature] if isinstance(feature, int) else list(feature)
    deepest = max(k if k >= 0 else layers + 1 + k for k in wanted)  # hidden_states[k]: after k layers
    grid = (get(v, "image_size") // get(v, "patch_size")) ** 2
    has_cls = kind == "clip"
    keeps_cls = has_cls and get(cfg, "vision_feature_select_strategy", "default") == "full"
    vh, th = get(v, "hidden_size"), get(text, "hidden_size")
    return one_encoder("llava", EncoderSpec(
        kind=kind, hidden=vh, ffn=get(v, "intermediate_size"), heads=get(v, "num_attention_heads"),
        layers_forward=layers, layers_backward=deepest,
        patch_in=get(v, "num_channels", 3) * get(v, "patch_size") ** 2,
        tokens_per_image=grid + int(keeps_cls), merge=1, cls_tokens=int(has_cls and not keeps_cls),
        projector=((vh * len(wanted), th), (th, th)),
        # CLIP: conv without bias, CLS, grid + 1 positions, pre-layernorm; SigLIP: conv with bias, grid positions
        embed_params=(get(v, "num_channels", 3) * get(v, "patch_size") ** 2 * vh
                      + ((vh + (grid + 1) * vh + 2 * vh) if has_cls else (vh + grid * vh))),
    ), language_shapes(text, cfg))


def qwen2_vl(cfg: Any) -> ModelSpec:
    v, text = get(cfg, "vision_config"), get(cfg, "text_config") or cfg
    e, m = get(v, "embed_dim"), get(v, "spatial_merge_size")
    merged = e * m * m
    depth = get(v, "depth")
    patch_in = get(v, "in_chans", get(v, "in_channels", 3)) * get(v, "temporal_patch_size") * get(v, "patch_size") ** 2
    return one_encoder("qwen2_vl", EncoderSpec(
        kind="qwen2_vl", hidden=e, ffn=int(e * get(v, "mlp_ratio")), heads=get(v, "num_heads"),
        layers_forward=depth, layers_backward=depth,
        patch_in=patch_in, tokens_per_image=0, merge=m * m, cls_tokens=0,
        projector=((merged, merged), (merged, get(v, "hidden_size"))), projector_norm=2 * e,
        embed_params=patch_in * e,  # a Conv3d without bias; rotary positions have no parameters
    ), language_shapes(text, cfg))


def qwen2_5_vl(cfg: Any) -> ModelSpec:
    v, text = get(cfg, "vision_config"), get(cfg, "text_config") or cfg
    e, m, depth = get(v, "hidden_size"), get(v, "spatial_merge_size"), get(v, "depth")
    merged = e * m * m
    patch = get(v, "patch_size")
    patch_in = get(v, "in_channels", 3) * get(v, "temporal_patch_size") * patch ** 2
    side = get(v, "window_size") // m // patch  # merged tokens per window side (the tower's rule)
    full = len({i for i in get(v, "fullatt_block_indexes") if 0 <= i < depth})
    return one_encoder("qwen2_5_vl", EncoderSpec(
        kind="qwen2_5_vl", hidden=e, ffn=get(v, "intermediate_size"), heads=get(v, "num_heads"),
        layers_forward=depth, layers_backward=depth, patch_in=patch_in, tokens_per_image=0, merge=m * m,
        cls_tokens=0, projector=((merged, merged), (merged, get(v, "out_hidden_size"))), projector_norm=e,
        embed_params=patch_in * e, window=(side * m) ** 2, full_layers=full, gated_mlp=True, rms_norms=True,
    ), language_shapes(text, cfg))


def qwen3_vl(cfg: Any) -> ModelSpec:
    v, text = get(cfg, "vision_config"), get(cfg, "text_config")
    if str(get(cfg, "model_type", "")) == "qwen3_vl_moe":
        raise ValueError("qwen3_vl_moe: the planner (like the engine) has no expert parallelism")
    e, m, depth = get(v, "hidden_size"), get(v, "spatial_merge_size"), get(v, "depth")
    merged = e * m * m
    patch_in = get(v, "in_channels", 3) * get(v, "temporal_patch_size") * get(v, "patch_size") ** 2
    levels = len(get(v, "deepstack_visual_indexes"))
    heads = get(text, "num_attention_heads")
    head_dim = get(text, "head_dim") or get(text, "hidden_size") // heads
    language = language_shapes(text, cfg)
    language = LanguageSpec(**{**language.__dict__, "extra_layer_norms": 2 * head_dim})  # q_norm, k_norm
    return one_encoder("qwen3_vl", EncoderSpec(
        kind="qwen3_vl", hidden=e, ffn=get(v, "intermediate_size"), heads=get(v, "num_heads"),
        layers_forward=depth, layers_backward=depth, patch_in=patch_in, tokens_per_image=0, merge=m * m,
        cls_tokens=0, projector=((merged, merged), (merged, get(v, "out_hidden_size"))),
        # the merger's LayerNorm over e, each DeepStack merger's over the merged width
        projector_norm=2 * e + levels * 2 * merged, deepstack=levels,
        # a Conv3d with bias and the learned position grid
        embed_params=patch_in * e + e + get(v, "num_position_embeddings") * e,
    ), language)


def internvl(cfg: Any) -> ModelSpec:
    v, text = get(cfg, "vision_config"), get(cfg, "text_config")
    size, patch = get(v, "image_size"), get(v, "patch_size")
    size, patch = (size if isinstance(size, int) else size[0]), (patch if isinstance(patch, int) else patch[0])
    h, th = get(v, "hidden_size"), get(text, "hidden_size")
    grid = (size // patch) ** 2
    shuffle = int(round(1 / get(cfg, "downsample_ratio", 0.5))) ** 2  # patches folded into one token
    layers = get(v, "num_hidden_layers")
    feature = get(cfg, "vision_feature_layer", -1)
    deepest = feature if feature >= 0 else layers + 1 + feature
    qkv_bias = bool(get(v, "attention_bias", False))
    qk_norm = 2 * h if get(v, "use_qk_norm", False) else 0
    final_norm = 0 if get(v, "use_mean_pooling", True) else 2 * h
    return one_encoder("internvl", EncoderSpec(
        kind="internvl", hidden=h, ffn=get(v, "intermediate_size"), heads=get(v, "num_attention_heads"),
        layers_forward=layers, layers_backward=deepest, patch_in=get(v, "num_channels", 3) * patch ** 2,
        tokens_per_image=get(cfg, "image_seq_length"), merge=shuffle,
        cls_tokens=int(get(cfg, "vision_feature_select_strategy", "default") == "default"),
        projector=((h * shuffle, th), (th, th)), projector_norm=2 * h * shuffle,
        # no q/k/v biases unless attention_bias; two layer scales (lambda_1, lambda_2); optional q/k norms
        layer_extra=(0 if qkv_bias else -3 * h) + 2 * h + qk_norm,
        # patch conv with bias, CLS token, grid + 1 positions, the final norm (Identity with mean pooling)
        embed_params=get(v, "num_channels", 3) * patch ** 2 * h + h + h + (grid + 1) * h + final_norm,
    ), language_shapes(text, cfg))


def llava_onevision(cfg: Any) -> ModelSpec:
    """SigLIP tiles + projector; the image-token count varies with the image (any resolution), so,
    as for Qwen2-VL, the planner's --image-tokens sets it (one row per tile patch, before unpadding)."""
    v, text = get(cfg, "vision_config"), get(cfg, "text_config")
    spec = llava({**({k: get(cfg, k) for k in ("vision_feature_layer", "vision_feature_select_strategy")}),
                   "vision_config": v, "text_config": text})
    vision = EncoderSpec(**{**spec.vision.__dict__, "kind": "llava_onevision", "tokens_per_image": 0,
                           "cls_tokens": 0, "projector_norm": get(text, "hidden_size")})  # + image_newline
    return one_encoder("llava_onevision", vision, spec.language)


def gemma3(cfg: Any) -> ModelSpec:
    v, text = get(cfg, "vision_config"), get(cfg, "text_config")
    vh, th = get(v, "hidden_size"), get(text, "hidden_size")
    grid = (get(v, "image_size") // get(v, "patch_size")) ** 2
    tokens = get(cfg, "mm_tokens_per_image", 256)
    layers = get(v, "num_hidden_layers")
    heads = get(text, "num_attention_heads")
    head_dim = get(text, "head_dim") or th // heads
    language = language_shapes(text, cfg)
    language = LanguageSpec(**{**language.__dict__, "extra_layer_norms": 2 * th + 2 * head_dim})
    return one_encoder("gemma3", EncoderSpec(
        kind="gemma3", hidden=vh, ffn=get(v, "intermediate_size"), heads=get(v, "num_attention_heads"),
        layers_forward=layers, layers_backward=layers, patch_in=get(v, "num_channels", 3) * get(v, "patch_size") ** 2,
        tokens_per_image=tokens, merge=grid // tokens, cls_tokens=0, projector=((vh, th),), projector_norm=vh,
        # SigLIP: conv with bias, grid positions; its post-layernorm runs before the pooling
        embed_params=get(v, "num_channels", 3) * get(v, "patch_size") ** 2 * vh + vh + grid * vh + 2 * vh,
    ), language)


AUDIO_KIND = "qwen2_5_omni_audio"


def audio_rows(frames: int) -> int:
    """Boundary rows of a clip of `frames` mel frames (the encoder's stride-2 conv, then stride-2 pooling)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def audio_spec(a: Any) -> EncoderSpec:
    """The audio encoder of a Qwen2.5-Omni thinker config (`audio_config`) as encoder shapes."""
    d, n_mel, out = get(a, "d_model"), get(a, "num_mel_bins"), get(a, "output_dim")
    layers = get(a, "encoder_layers")
    return EncoderSpec(
        kind=AUDIO_KIND, hidden=d, ffn=get(a, "encoder_ffn_dim"), heads=get(a, "encoder_attention_heads"),
        layers_forward=layers, layers_backward=layers,
        patch_in=2 * 3 * n_mel, stem_in=3 * d,  # conv1 over 2 frames per token; conv2
        tokens_per_image=0, merge=2, cls_tokens=0,  # rows vary with the clip: the workload sets them
        projector=((d, out),), projector_norm=2 * d, replicated_projector=True,
        embed_params=3 * n_mel * d + d + 3 * d * d + d,  # conv1, conv2 (with biases); sinusoid positions: a buffer
        window=get(a, "n_window"), full_layers=0,
        layer_extra=-d,  # k_proj has no bias
        held=2 * out,  # audio_bos_eos_token
    )


def thinker(cfg: Any) -> Any:
    """The thinker's config of a Qwen2.5-Omni config (the whole model's config holds it)."""
    return get(cfg, "thinker_config") if str(get(cfg, "model_type", "")) == "qwen2_5_omni" else cfg


def qwen2_5_omni(cfg: Any) -> ModelSpec:
    """The Qwen2.5-Omni thinker (a whole Omni config or the thinker's): vision, audio, language."""
    think = thinker(cfg)
    text = get(think, "text_config")
    # the vision tower is Qwen2.5-VL's (windowed blocks, gated MLP, RMSNorms, merger)
    vision = qwen2_5_vl({"vision_config": get(think, "vision_config"), "text_config": text}).vision
    return ModelSpec("qwen2_5_omni", (("vision", vision), ("audio", audio_spec(get(think, "audio_config")))),
                     language_shapes(text, think))


# HF model_type -> the family's reader
READERS = {
    "llava": llava, "llava_onevision": llava_onevision, "qwen2_vl": qwen2_vl, "qwen2_5_vl": qwen2_5_vl,
    "qwen3_vl": qwen3_vl, "qwen3_vl_moe": qwen3_vl, "internvl": internvl, "gemma3": gemma3,
    "qwen2_5_omni": qwen2_5_omni, "qwen2_5_omni_thinker": qwen2_5_omni,
}
