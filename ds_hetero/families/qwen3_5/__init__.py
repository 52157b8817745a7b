"""Qwen3.5 (dense): a Qwen3-VL-like vision tower; a decoder of Gated DeltaNet (linear-attention) and
full-attention layers, 3 to 1, the linear ones sharded over tp by heads (plans.py).

The family's home (families/family.py says what each file holds)."""

from ..family import Family
from ..qwen2_vl.sample_format import shapes_samples  # patchified as Qwen2-VL's processor does
from .adapter import Qwen3_5Adapter
from .plans import TP_PLANS
from .shapes import SHAPES
from .tiny import tiny_qwen3_5

FAMILY = Family(
    "qwen3.5", model_classes=("Qwen3_5ForConditionalGeneration",), model_types=("qwen3_5",),
    adapter=Qwen3_5Adapter, tiny=tiny_qwen3_5, tp_plans=TP_PLANS, shapes_samples=shapes_samples,
    shapes=SHAPES, video_rules={"Qwen3VLProcessor": "qwen3"},  # Qwen3.5 checkpoints name Qwen3-VL's processor
)
