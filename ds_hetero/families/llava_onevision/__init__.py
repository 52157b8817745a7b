"""LLaVA-OneVision: any-resolution tiles, unpadded features and newlines.

The family's home (families/family.py says what each file holds)."""

from ..family import Family
from .adapter import LlavaOnevisionAdapter
from .plans import TP_PLANS
from .shapes import SHAPES
from .sample_format import shapes_samples
from .tiny import tiny_llava_onevision

FAMILY = Family(
    "llava-onevision", model_classes=("LlavaOnevisionForConditionalGeneration",), model_types=("llava_onevision",),
    adapter=LlavaOnevisionAdapter, tiny=tiny_llava_onevision, tp_plans=TP_PLANS, shapes_samples=shapes_samples, shapes=SHAPES,
)
