"""Qwen3-VL (dense): DeepStack levels of the vision tower added into the first decoder layers.

The family's home (families/family.py says what each file holds)."""

from ..family import Family
from .adapter import Qwen3VLAdapter
from ..qwen2_vl.media_tokens import image_tokens  # Qwen2-VL's smart_resize (Qwen3-VL's patch size)
from .plans import TP_PLANS
from .shapes import SHAPES
from ..qwen2_vl.sample_format import shapes_samples  # patchified as Qwen2-VL's processor does
from .tiny import tiny_qwen3_vl

FAMILY = Family(
    "qwen3-vl", model_classes=("Qwen3VLForConditionalGeneration",), model_types=("qwen3_vl",),
    adapter=Qwen3VLAdapter, tiny=tiny_qwen3_vl, tp_plans=TP_PLANS, shapes_samples=shapes_samples, shapes=SHAPES,
    media_tokens={"Qwen3VLProcessor": image_tokens}, video_rules={"Qwen3VLProcessor": "qwen3"},
)
