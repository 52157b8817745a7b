"""The planner's shapes of Qwen2-VL (the tower sees spatial_merge^2 patches per image token), read from
its Hugging Face config.

`SHAPES` maps each HF `model_type` this family reads to its reader (the registry, families/__init__.py,
hands them to the planner: planner/model_spec.py); the records are models/shapes.py's.
"""

from __future__ import annotations

from typing import Any

from ...models.shapes import EncoderSpec, ModelSpec, get, language_shapes, one_encoder


def shapes(cfg: Any) -> ModelSpec:
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


SHAPES = {"qwen2_vl": shapes}
