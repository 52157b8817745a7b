"""The planner's shapes of Gemma 3 (SigLIP with pooling, one bias-free projection), read from its Hugging Face config.

`SHAPES` maps each HF `model_type` this family reads to its reader (the registry, families/__init__.py,
hands them to the planner: planner/model_spec.py); the records are models/shapes.py's.
"""

from __future__ import annotations

from typing import Any

from ...models.shapes import EncoderSpec, LanguageSpec, ModelSpec, get, language_shapes, one_encoder


def shapes(cfg: Any) -> ModelSpec:
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


SHAPES = {"gemma3": shapes}
