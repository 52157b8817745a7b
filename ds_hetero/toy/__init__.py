"""Toy models and synthetic data for demos, tests and benchmarks: nothing the runtime imports.

    shapes.py          the "coloured shapes" captioning dataset a tiny VLM learns in minutes on a CPU
    family_formats.py  that dataset in each model family's sample format
    omni_shapes.py     shapes heard and seen, for the Qwen2.5-Omni thinker
    messages.py        the captions as a TRL user holds them (messages + PIL images)
    processors.py      local processors (tokenizer, image processor) for the tiny models
"""

from .shapes import COLOURS, SHAPES, LlavaFormat, Qwen2VLFormat, RawFormat, Shape, ShapesCaptionDataset, Vocabulary

__all__ = ["COLOURS", "SHAPES", "LlavaFormat", "Qwen2VLFormat", "RawFormat", "Shape", "ShapesCaptionDataset",
           "Vocabulary"]
