"""Adapters that split a Hugging Face multimodal model into stages."""

from __future__ import annotations

from types import MappingProxyType

from .adapter import IGNORE_INDEX, StageAdapter
from .gemma3 import Gemma3Adapter, split_gemma3
from .internvl import InternVLAdapter, split_internvl
from .llava_onevision import LlavaOnevisionAdapter, split_llava_onevision
from .llava import LlavaAdapter, LlavaLanguageStage, LlavaVisionStage, split_llava
from .qwen2_5_omni import Qwen2_5OmniAdapter, split_qwen2_5_omni
from .qwen2_5_vl import Qwen2_5_VLAdapter, split_qwen2_5_vl
from .qwen2_vl import Qwen2VLAdapter, split_qwen2_vl
from .qwen3_vl import Qwen3VLAdapter, split_qwen3_vl
from .qwen3_vl_moe import Qwen3VLMoeAdapter
from .refused import REFUSED, refusal

# Model class name -> adapter. Names, not classes, so a model family's module is only imported
# by the adapter that needs it.
ADAPTERS = MappingProxyType({
    "LlavaForConditionalGeneration": LlavaAdapter,
    "Qwen2VLForConditionalGeneration": Qwen2VLAdapter,
    "Qwen2_5OmniThinkerForConditionalGeneration": Qwen2_5OmniAdapter,
    "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLAdapter,
    "Gemma3ForConditionalGeneration": Gemma3Adapter,
    "Qwen3VLForConditionalGeneration": Qwen3VLAdapter,
    "Qwen3VLMoeForConditionalGeneration": Qwen3VLMoeAdapter,
    "InternVLForConditionalGeneration": InternVLAdapter,
    "LlavaOnevisionForConditionalGeneration": LlavaOnevisionAdapter,
})


def known_encoder_stages() -> tuple[str, ...]:
    """Every encoder stage some model family here has (what a config may name without a model)."""
    return tuple(dict.fromkeys(name for adapter in ADAPTERS.values() for name in adapter.ENCODER_STAGES))


def adapter_for(model) -> StageAdapter:
    """The stage adapter of a Hugging Face multimodal model instance."""
    for cls in type(model).__mro__:
        if cls.__name__ in ADAPTERS:
            return ADAPTERS[cls.__name__](model)
        if cls.__name__ in REFUSED:
            raise TypeError(refusal(cls.__name__))
    raise TypeError(
        f"ds_hetero has no stage adapter for {type(model).__name__}; supported: {', '.join(sorted(ADAPTERS))}"
    )


__all__ = [
    "ADAPTERS", "Gemma3Adapter", "IGNORE_INDEX", "InternVLAdapter", "LlavaAdapter", "LlavaLanguageStage",
    "LlavaOnevisionAdapter", "LlavaVisionStage", "Qwen2VLAdapter", "Qwen2_5OmniAdapter", "Qwen2_5_VLAdapter",
    "Qwen3VLAdapter", "Qwen3VLMoeAdapter", "StageAdapter", "adapter_for", "known_encoder_stages", "split_gemma3", "split_internvl",
    "split_llava", "split_llava_onevision", "split_qwen2_5_omni", "split_qwen2_5_vl", "split_qwen2_vl",
    "split_qwen3_vl",
]
