"""The planner's shapes of Qwen2.5-VL (windowed blocks, gated MLP, RMSNorms, merger), read from its Hugging Face config.

`SHAPES` maps each HF `model_type` this family reads to its reader (the registry, families/__init__.py,
hands them to the planner: planner/model_spec.py); the records are models/shapes.py's.
"""

from __future__ import annotations

from typing import Any

from ...models.shapes import EncoderSpec, ModelSpec, get, language_shapes, one_encoder


def shapes(cfg: Any) -> ModelSpec:
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


SHAPES = {"qwen2_5_vl": shapes}
