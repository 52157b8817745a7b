"""LLaVA (CLIP or SigLIP tower + a Llama / Qwen2 decoder): vision and language stages.

The family's home (families/family.py says what each file holds)."""

from ..family import Family
from .adapter import LlavaAdapter
from .media_tokens import MEDIA_TOKENS
from .plans import TP_PLANS
from .shapes import SHAPES
from .sample_format import shapes_samples
from .tiny import tiny_llava

FAMILY = Family(
    "llava", model_classes=("LlavaForConditionalGeneration",), model_types=("llava",),
    adapter=LlavaAdapter, tiny=tiny_llava, tp_plans=TP_PLANS, shapes_samples=shapes_samples, shapes=SHAPES,
    media_tokens=MEDIA_TOKENS,
)
