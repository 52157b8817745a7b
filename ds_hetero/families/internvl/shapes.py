"""The planner's shapes of InternVL (InternViT, pixel shuffle, layer scales), read from its Hugging Face config.

`SHAPES` maps each HF `model_type` this family reads to its reader (the registry, families/__init__.py,
hands them to the planner: planner/model_spec.py); the records are models/shapes.py's.
"""

from __future__ import annotations

from typing import Any

from ...models.shapes import EncoderSpec, ModelSpec, get, language_shapes, one_encoder


def shapes(cfg: Any) -> ModelSpec:
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


SHAPES = {"internvl": shapes}
