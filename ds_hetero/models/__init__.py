"""Adapters that split a Hugging Face multimodal model into stages."""

from .llava import LlavaLanguageStage, LlavaVisionStage, split_llava

__all__ = ["LlavaLanguageStage", "LlavaVisionStage", "split_llava"]
