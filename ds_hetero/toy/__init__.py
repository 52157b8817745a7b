"""Toy models and synthetic data for demos, tests and benchmarks: nothing the runtime imports.

    shapes.py          the "coloured shapes" captioning dataset a tiny VLM learns in minutes on a CPU
    family_formats.py  that dataset in each model family's sample format
    omni_shapes.py     shapes heard and seen, for the Qwen2.5-Omni thinker
    messages.py        the captions as a TRL user holds them (messages + PIL images)
    processors.py      local processors (tokenizer, image processor) for the tiny models
    length_mix.py      a seeded SFT-shaped mix of sample lengths (the packing benchmark's, the planner's)

and every model family's tiny model (defined in its home, families/<family>/tiny.py), so that demos and
tests import their models and data from one place.
"""

from ..families.gemma3.tiny import GEMMA3_IDS, tiny_gemma3
from ..families.gemma4.tiny import GEMMA4_IDS, tiny_gemma4
from ..families.internvl.tiny import INTERNVL_IDS, tiny_internvl
from ..families.llava.sample_format import LlavaFormat
from ..families.llava.tiny import LLAVA_IMAGE_TOKEN, llava_tokens_per_image, tiny_llava
from ..families.llava_onevision.tiny import tiny_llava_onevision
from ..families.qwen2_5_omni.tiny import OMNI_SPECIAL_IDS, tiny_qwen2_5_omni
from ..families.qwen2_5_vl.tiny import tiny_qwen2_5_vl
from ..families.qwen2_vl.sample_format import Qwen2VLFormat
from ..families.qwen2_vl.tiny import QWEN_SPECIAL_IDS, tiny_qwen2_vl
from ..families.qwen3_5.tiny import tiny_qwen3_5
from ..families.qwen3_5_moe.tiny import tiny_qwen3_5_moe
from ..families.qwen3_vl.tiny import tiny_qwen3_vl
from .shapes import COLOURS, SHAPES, RawFormat, Shape, ShapesCaptionDataset, Vocabulary

__all__ = [
    "COLOURS", "GEMMA3_IDS", "GEMMA4_IDS", "INTERNVL_IDS", "LLAVA_IMAGE_TOKEN", "LlavaFormat", "OMNI_SPECIAL_IDS", "QWEN_SPECIAL_IDS",
    "Qwen2VLFormat", "RawFormat", "SHAPES", "Shape", "ShapesCaptionDataset", "Vocabulary", "llava_tokens_per_image",
    "tiny_gemma3", "tiny_gemma4", "tiny_internvl", "tiny_llava", "tiny_llava_onevision", "tiny_qwen2_5_omni",
    "tiny_qwen2_5_vl", "tiny_qwen2_vl", "tiny_qwen3_5", "tiny_qwen3_5_moe", "tiny_qwen3_vl",
]
