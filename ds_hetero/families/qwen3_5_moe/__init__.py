"""Qwen3.5-MoE: Qwen3.5 (Gated DeltaNet and gated full-attention layers, 3 to 1) with a mixture-of-experts
block, routed experts over `stages.language.ep` and a shared expert, in every decoder layer.

The family's home (families/family.py says what each file holds); what it shares with Qwen3.5 is in
families/qwen3_5/, with the other MoE families in families/moe.py; the expert-parallel axis is
ds_hetero/expert_parallel/ (docs/expert-parallel.md)."""

from ..family import Family
from .adapter import Qwen3_5MoeAdapter, Qwen3_5MoeLanguageStage
from .plans import TP_PLANS
from .sample_format import shapes_samples
from .shapes import SHAPES
from .tiny import tiny_qwen3_5_moe

FAMILY = Family(
    "qwen3.5-moe", model_classes=("Qwen3_5MoeForConditionalGeneration",), model_types=("qwen3_5_moe",),
    adapter=Qwen3_5MoeAdapter, tiny=tiny_qwen3_5_moe, tp_plans=TP_PLANS, shapes_samples=shapes_samples, shapes=SHAPES,
)

__all__ = ["FAMILY", "Qwen3_5MoeAdapter", "Qwen3_5MoeLanguageStage", "tiny_qwen3_5_moe"]
