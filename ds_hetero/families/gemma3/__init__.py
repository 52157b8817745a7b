"""Gemma 3: pooled SigLIP image tokens, bidirectional attention inside each image block.

The family's home (families/family.py says what each file holds)."""

from ..family import Family
from .adapter import Gemma3Adapter
from .plans import TP_PLANS
from .shapes import SHAPES
from .sample_format import shapes_samples
from .tiny import tiny_gemma3

FAMILY = Family(
    "gemma3", model_classes=("Gemma3ForConditionalGeneration",), model_types=("gemma3",),
    adapter=Gemma3Adapter, tiny=tiny_gemma3, tp_plans=TP_PLANS, shapes_samples=shapes_samples, shapes=SHAPES,
)
