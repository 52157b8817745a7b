"""Gemma 4: a vision and an audio (conformer) encoder, each its own stage; a decoder with per-layer embeddings,
kv-shared layers, bidirectional image blocks and, with `enable_moe_block`, an MoE block over `ep`.

The family's home (families/family.py says what each file holds)."""

from ..family import Family
from .adapter import Gemma4Adapter
from .plans import TP_PLANS
from .sample_format import shapes_samples
from .shapes import SHAPES
from .tiny import tiny_gemma4

FAMILY = Family(
    "gemma4", model_classes=("Gemma4ForConditionalGeneration",), model_types=("gemma4",),
    adapter=Gemma4Adapter, tiny=tiny_gemma4, tp_plans=TP_PLANS, shapes_samples=shapes_samples, shapes=SHAPES,
)
