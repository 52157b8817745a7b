"""Qwen2.5-VL: Qwen2-VL with a windowed vision tower.

The family's home (families/family.py says what each file holds)."""

from ..family import Family
from .adapter import Qwen2_5_VLAdapter
from ..qwen2_vl.media_tokens import image_tokens  # Qwen2-VL's smart_resize
from .plans import TP_PLANS
from .shapes import SHAPES
from ..qwen2_vl.sample_format import shapes_samples  # patchified as Qwen2-VL's processor does
from .tiny import tiny_qwen2_5_vl

FAMILY = Family(
    "qwen2.5-vl", model_classes=("Qwen2_5_VLForConditionalGeneration",), model_types=("qwen2_5_vl",),
    adapter=Qwen2_5_VLAdapter, tiny=tiny_qwen2_5_vl, tp_plans=TP_PLANS, shapes_samples=shapes_samples, shapes=SHAPES,
    media_tokens={"Qwen2_5_VLProcessor": image_tokens}, video_rules={"Qwen2_5_VLProcessor": "qwen2"},
)
