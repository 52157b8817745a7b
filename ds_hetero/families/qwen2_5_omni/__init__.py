"""The Qwen2.5-Omni thinker: a vision and an audio encoder, each its own stage (its data: toy/omni_shapes.py).

The family's home (families/family.py says what each file holds)."""

from ..family import Family
from .adapter import Qwen2_5OmniAdapter
from .plans import TP_PLANS
from .shapes import SHAPES
from .tiny import tiny_qwen2_5_omni

FAMILY = Family(
    "qwen2.5-omni", model_classes=("Qwen2_5OmniThinkerForConditionalGeneration",), model_types=("qwen2_5_omni_thinker",),
    adapter=Qwen2_5OmniAdapter, tiny=tiny_qwen2_5_omni, tp_plans=TP_PLANS, shapes_samples=None, shapes=SHAPES,
)
