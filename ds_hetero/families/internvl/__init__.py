"""InternVL: images cut into tiles, one <img> ... </img> run per image.

The family's home (families/family.py says what each file holds)."""

from ..family import Family
from .adapter import InternVLAdapter
from .plans import TP_PLANS
from .shapes import SHAPES
from .sample_format import shapes_samples
from .tiny import tiny_internvl

FAMILY = Family(
    "internvl", model_classes=("InternVLForConditionalGeneration",), model_types=("internvl",),
    adapter=InternVLAdapter, tiny=tiny_internvl, tp_plans=TP_PLANS, shapes_samples=shapes_samples, shapes=SHAPES,
)
