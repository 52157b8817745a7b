"""Datasets for training and tests; everything is generated in code (no downloads)."""

from .shapes import (COLOURS, SHAPES, LlavaFormat, Qwen2VLFormat, RawFormat, Shape, ShapesCaptionDataset,
                     Vocabulary)
from .samples import as_sample_list, split_collated

__all__ = [
    "COLOURS", "SHAPES", "LlavaFormat", "Qwen2VLFormat", "RawFormat", "Shape", "ShapesCaptionDataset", "Vocabulary",
    "as_sample_list", "split_collated",
]
