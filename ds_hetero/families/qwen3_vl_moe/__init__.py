"""Qwen3-VL-MoE: Qwen3-VL (DeepStack) with a mixture-of-experts decoder, its experts over `stages.language.ep`.

The family's home (families/family.py says what each file holds); the expert-parallel axis is
ds_hetero/expert_parallel/ (docs/expert-parallel.md)."""

from ..family import Family
from .adapter import Qwen3VLMoeAdapter, Qwen3VLMoeLanguageStage
from .plans import TP_PLANS
from .shapes import SHAPES
from ..qwen2_vl.sample_format import shapes_samples  # patchified as Qwen2-VL's processor does
from .tiny import tiny_qwen3_vl_moe

FAMILY = Family(
    "qwen3-vl-moe", model_classes=("Qwen3VLMoeForConditionalGeneration",), model_types=("qwen3_vl_moe",),
    adapter=Qwen3VLMoeAdapter, tiny=tiny_qwen3_vl_moe, tp_plans=TP_PLANS, shapes_samples=shapes_samples, shapes=SHAPES,
)

__all__ = ["FAMILY", "Qwen3VLMoeAdapter", "Qwen3VLMoeLanguageStage", "tiny_qwen3_vl_moe"]
