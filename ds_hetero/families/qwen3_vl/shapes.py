"""The planner's shapes of Qwen3-VL (DeepStack mergers; q/k norms in the decoder), read from its Hugging Face config.

`SHAPES` maps each HF `model_type` this family reads to its reader (the registry, families/__init__.py,
hands them to the planner: planner/model_spec.py); the records are models/shapes.py's.
"""

from __future__ import annotations

from typing import Any

from ...models.shapes import EncoderSpec, LanguageSpec, ModelSpec, get, language_shapes, one_encoder


def shapes(cfg: Any) -> ModelSpec:
    v, text = get(cfg, "vision_config"), get(cfg, "text_config")
    heads = get(text, "num_attention_heads")
    head_dim = get(text, "head_dim") or get(text, "hidden_size") // heads
    language = language_shapes(text, cfg)
    language = LanguageSpec(**{**language.__dict__, "extra_layer_norms": 2 * head_dim})  # q_norm, k_norm
    return one_encoder("qwen3_vl", tower(v, len(get(v, "deepstack_visual_indexes"))), language)


def tower(v: Any, levels: int) -> EncoderSpec:
    """Qwen3-VL's vision tower and merger, with `levels` DeepStack mergers (Qwen3.5's tower: none)."""
    e, m, depth = get(v, "hidden_size"), get(v, "spatial_merge_size"), get(v, "depth")
    merged = e * m * m
    patch_in = get(v, "in_channels", 3) * get(v, "temporal_patch_size") * get(v, "patch_size") ** 2
    return EncoderSpec(
        kind="qwen3_vl", hidden=e, ffn=get(v, "intermediate_size"), heads=get(v, "num_heads"),
        layers_forward=depth, layers_backward=depth, patch_in=patch_in, tokens_per_image=0, merge=m * m,
        cls_tokens=0, projector=((merged, merged), (merged, get(v, "out_hidden_size"))),
        # the merger's LayerNorm over e, each DeepStack merger's over the merged width
        projector_norm=2 * e + levels * 2 * merged, deepstack=levels,
        # a Conv3d with bias and the learned position grid
        embed_params=patch_in * e + e + get(v, "num_position_embeddings") * e,
    )


SHAPES = {"qwen3_vl": shapes}
