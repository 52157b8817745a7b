"""Qwen3.5-MoE's samples are Qwen2-VL's (its processor patchifies images as Qwen2-VL's does)."""

from ..qwen2_vl.sample_format import shapes_samples

__all__ = ["shapes_samples"]
