"""The planner's shapes of Gemma 4 (vision tower with pooling, conformer audio tower, decoder), read from its
Hugging Face config.

`SHAPES` maps each HF `model_type` this family reads to its reader (the registry, families/__init__.py,
hands them to the planner: planner/model_spec.py); the records are models/shapes.py's.

The records' formulas describe a plain transformer layer; Gemma 4's layers differ (per-layer head_dim and
kv heads on the full layers, kv-shared layers without k/v, per-layer embeddings, the MoE block next to
the dense MLP, the conformer's two feed-forwards, light conv and relative-position keys). Each reader
counts the real parameters by hand and puts the difference in the records' per-layer extra
(`layer_extra`, `extra_layer_norms`), so the parameter counts (and memory) are the model's; the
extra is priced as replicated over tp (the per-layer embeddings, the MoE block and the light conv are
replicated over tp, plans.py). With the MoE block (`enable_moe_block`, 26B-A4B) the routed experts are the
records' experts (their FLOPs, ep sharding and dispatch priced as any MoE's) and the dense MLP beside them
its shared expert (priced on every token, split over tp; its parameters stay in the per-layer extra, so
they count as replicated over tp in memory). The other FLOPs of the extra are not modelled beyond the
plain layer's: an approximation (the sliding-window layers' attention is priced over the whole sequence,
the full layers' 512-wide heads as the 256-wide ones). `tokens_per_image` is the
processor's default soft-token budget (280).
"""

from __future__ import annotations

from typing import Any

from ...models.shapes import EncoderSpec, LanguageSpec, ModelSpec, get, language_shapes

IMAGE_TOKENS = 280  # Gemma4Processor's image_seq_length


def _vision(v: Any, th: int) -> EncoderSpec:
    h, f, heads = get(v, "hidden_size"), get(v, "intermediate_size"), get(v, "num_attention_heads")
    hd, kvh, p = get(v, "head_dim"), get(v, "num_key_value_heads") or heads, get(v, "patch_size")
    real = 2 * h * heads * hd + 2 * h * kvh * hd + 3 * h * f + 4 * h + 2 * hd  # no biases; 4 norms, q/k norms
    base = EncoderSpec("gemma4", h, f, heads, 1, 1, 0, 0, 1, 0, (), 0, gated_mlp=True, rms_norms=True).layer_params()
    layers, k = get(v, "num_hidden_layers"), get(v, "pooling_kernel_size")
    return EncoderSpec(
        kind="gemma4", hidden=h, ffn=f, heads=heads, layers_forward=layers, layers_backward=layers,
        patch_in=3 * p * p, tokens_per_image=IMAGE_TOKENS, merge=k * k, cls_tokens=0, projector=((h, th),),
        embed_params=3 * p * p * h + 2 * get(v, "position_embedding_size") * h, gated_mlp=True, rms_norms=True,
        layer_extra=real - base)


def _audio(a: Any, th: int) -> EncoderSpec:
    h, heads = get(a, "hidden_size"), get(a, "num_attention_heads")
    c0, c1 = get(a, "subsampling_conv_channels")
    out = get(a, "output_proj_dims")
    ffw = 2 * (8 * h * h + 2 * h)  # two feed-forwards: h -> 4h -> h, pre and post norms
    attn = 5 * h * h + h // heads  # q, k, v, post, relative_k_proj; per_dim_scale
    lconv = 2 * h * h + h * h + get(a, "conv_kernel_size") * h + 2 * h  # linear_start (GLU), linear_end, conv, norms
    real = ffw + attn + lconv + 3 * h
    base = EncoderSpec("gemma4_audio", h, 4 * h, heads, 1, 1, 0, 0, 1, 0, (), 0, rms_norms=True).layer_params()
    layers = get(a, "num_hidden_layers")
    stem = 9 * c0 + c0 + 9 * c0 * c1 + c1 + (c0 // 4) * c1 * h  # two 3x3 convs with their norms; input_proj
    return EncoderSpec(
        kind="gemma4_audio", hidden=h, ffn=4 * h, heads=heads, layers_forward=layers, layers_backward=layers,
        patch_in=4 * c0, tokens_per_image=0, merge=1, cls_tokens=0, projector=((out, th),),
        # output_proj (with bias) after the layers; the projector has no bias (projector_params counts one)
        embed_params=stem + h * out + out - th, rms_norms=True, replicated_projector=True,
        window=get(a, "attention_chunk_size") + get(a, "attention_context_left") - 1, full_layers=0,
        layer_extra=real - base)


def _layer_types(t: Any) -> list[str]:
    """Gemma4TextConfig's layer types: given, or five sliding layers to one full, the last one full."""
    n = get(t, "num_hidden_layers")
    types = list(get(t, "layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)])
    types[-1] = "full_attention"
    return types


def _attention_shape(t: Any, i: int, full: bool) -> tuple[int, int]:
    """(head_dim, kv heads) of layer i: its `per_layer_config` override, or as Gemma4TextConfig sets the
    full layers' (`global_head_dim`, default 512; `num_global_key_value_heads` with attention_k_eq_v)."""
    override = (get(t, "per_layer_config") or {}).get(str(i)) or (get(t, "per_layer_config") or {}).get(i) or {}
    hd, kvh = get(t, "head_dim"), get(t, "num_key_value_heads")
    if full and get(t, "per_layer_config") is None:
        hd = get(t, "global_head_dim", 512)
        if get(t, "attention_k_eq_v") and get(t, "num_global_key_value_heads") is not None:
            kvh = get(t, "num_global_key_value_heads")
    return get(override, "head_dim", hd), get(override, "num_key_value_heads", kvh)


def _text_params(t: Any, tied: bool) -> int:
    """Gemma 4's decoder, embeddings and head, counted by hand (module docstring)."""
    h, heads, n = get(t, "hidden_size"), get(t, "num_attention_heads"), get(t, "num_hidden_layers")
    shared_from = n - (get(t, "num_kv_shared_layers") or 0)
    p, vocab = get(t, "hidden_size_per_layer_input") or 0, get(t, "vocab_size")
    total = vocab * h + h + (0 if tied else vocab * h)
    if p:
        total += get(t, "vocab_size_per_layer_input") * n * p + h * n * p + p
    for i, kind in enumerate(_layer_types(t)):
        full, shared = kind == "full_attention", i >= shared_from
        hd, kvh = _attention_shape(t, i, full)
        kv_mats = 0 if shared else (1 if get(t, "attention_k_eq_v") and full else 2)
        ffn = get(t, "intermediate_size") * (2 if get(t, "use_double_wide_mlp") and shared else 1)
        total += 2 * h * heads * hd + kv_mats * h * kvh * hd + hd + (0 if shared else hd) + 3 * h * ffn + 4 * h
        if p:
            total += 2 * h * p + h
        if get(t, "enable_moe_block"):
            e, m = get(t, "num_experts"), get(t, "moe_intermediate_size")
            total += h * e + h + e + 3 * e * m * h + 3 * h
    return total


def shapes(cfg: Any) -> ModelSpec:
    if hasattr(cfg, "to_dict"):  # a config object: its text config's head_dim is per layer (read the dict)
        cfg = cfg.to_dict()
    text, v, a = get(cfg, "text_config"), get(cfg, "vision_config"), get(cfg, "audio_config")
    th = get(text, "hidden_size")
    language = language_shapes(text, cfg)
    # the MoE block (26B-A4B): its routed experts priced as experts (flops.moe_work: FLOPs, ep, dispatch), the
    # dense MLP beside them as a shared expert every token passes through (the cost model's shared_ffn)
    moe = {"experts": get(text, "num_experts"), "top_k": get(text, "top_k_experts"),
           "moe_ffn": get(text, "moe_intermediate_size"), "shared_ffn": get(text, "intermediate_size")} \
        if get(text, "enable_moe_block") else {}
    base = LanguageSpec(**{**language.__dict__, "extra_layer_norms": 0, **moe})
    extra = (_text_params(text, language.tied) - base.params()) // language.layers
    language = LanguageSpec(**{**language.__dict__, "qkv_bias": False, "extra_layer_norms": extra, **moe})
    encoders = [("vision", _vision(v, th))] + ([("audio", _audio(a, th))] if a is not None else [])
    return ModelSpec("gemma4", tuple(encoders), language)


SHAPES = {"gemma4": shapes}
