"""Qwen2-VL: dynamic-resolution vision tower (variable image tokens) and an mRoPE decoder.

The family's home (families/family.py says what each file holds)."""

from ..family import Family
from .adapter import Qwen2VLAdapter
from .media_tokens import MEDIA_TOKENS
from .plans import TP_PLANS
from .shapes import SHAPES
from .sample_format import shapes_samples
from .tiny import tiny_qwen2_vl

FAMILY = Family(
    "qwen2-vl", model_classes=("Qwen2VLForConditionalGeneration",), model_types=("qwen2_vl",),
    adapter=Qwen2VLAdapter, tiny=tiny_qwen2_vl, tp_plans=TP_PLANS, shapes_samples=shapes_samples, shapes=SHAPES,
    media_tokens=MEDIA_TOKENS, video_rules={"Qwen2VLProcessor": "qwen2"},
)
