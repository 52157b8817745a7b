"""The planner's shapes of LLaVA-OneVision (SigLIP tiles; image tokens vary with the image), read from
its Hugging Face config.

`SHAPES` maps each HF `model_type` this family reads to its reader (the registry, families/__init__.py,
hands them to the planner: planner/model_spec.py); the records are models/shapes.py's.
"""

from __future__ import annotations

from typing import Any

from ...models.shapes import EncoderSpec, ModelSpec, get, one_encoder
from ..llava.shapes import shapes as llava


def shapes(cfg: Any) -> ModelSpec:
    """SigLIP tiles + projector; the image-token count varies with the image (any resolution), so,
    as for Qwen2-VL, the planner's --image-tokens sets it (one row per tile patch, before unpadding)."""
    v, text = get(cfg, "vision_config"), get(cfg, "text_config")
    spec = llava({**({k: get(cfg, k) for k in ("vision_feature_layer", "vision_feature_select_strategy")}),
                   "vision_config": v, "text_config": text})
    vision = EncoderSpec(**{**spec.vision.__dict__, "kind": "llava_onevision", "tokens_per_image": 0,
                           "cls_tokens": 0, "projector_norm": get(text, "hidden_size")})  # + image_newline
    return one_encoder("llava_onevision", vision, spec.language)


SHAPES = {"llava_onevision": shapes}
