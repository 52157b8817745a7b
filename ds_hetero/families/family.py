"""What one model family's home declares: everything ds_hetero needs to know about the family, in one record.

A family's home is its folder, ds_hetero/families/<family>/:

    adapter.py   the StageAdapter that cuts the Hugging Face model into stages, and its stage modules
    plans.py     its tensor-parallel plans (which module classes are sharded how)
    tiny.py      a tiny seeded model built from config (`tiny-<name>` for validate, tests and demos)
    sample_format.py  the shapes-captioning data in its sample format (toy/shapes.py), where it has one
    media_tokens.py  an image's token count from its size by the family's processors' resize rule (the
                 real-data length index), where the family has processors it knows
    video_frames.py  (qwen2_vl, shared by the Qwen-VL homes) a video file's frames sampled, resized and
                 patchified as the family's video processors do (the real-data path's clips)
    shapes.py    the planner's shapes of the model (models/shapes.py's records) read from its Hugging Face
                 config, one reader per HF `model_type` (`SHAPES`; planner/model_spec.py looks them up)
    __init__.py  the `FAMILY` record below, which the registry (families/__init__.py) lists in one line

and, where the family needs one, a file per concept of its own (gemma4/media.py: its media fields;
qwen3_5/packed_deltanet.py: its linear-attention layers restarted at every sample of a packed row).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from torch import nn


@dataclass(frozen=True)
class Family:
    """One model family.

    name           the user-facing name: `--model-family NAME` in the recipes, `tiny-NAME` as a built-in model
    model_classes  the Hugging Face model classes the adapter takes (matched by name along the model's MRO)
    model_types    the `model_type` values of their configs
    adapter        the StageAdapter subclass
    tiny           seed -> a tiny model of the family with seeded random weights (keyword sizes optional)
    tp_plans       module class ("transformers.models.x.modeling_x:Class") -> ShardPlan
    shapes_samples model config -> keyword arguments of toy/shapes.py ShapesCaptionDataset in this family's
                   sample format (None: the family has a dataset of its own in toy/)
    shapes         HF model_type -> the reader of the planner's shapes (HF config or its dict ->
                   models/shapes.py ModelSpec); empty: the planner does not plan the family
    media_tokens   HF processor class -> (processor, height, width) -> the image's placeholder-token count,
                   by the processor's own resize rule and without its pixels (media_tokens.py; the real-data
                   length index reads sizes from image headers; sft_data/length_index.py)
    video_rules    HF processor class -> the name of the video rule its clips are sampled, resized and
                   patchified by (qwen2_vl/video_frames.py: "qwen2" or "qwen3"); empty: the family reads no
                   video files (the real-data path refuses a row with videos for its processors)
    """

    name: str
    model_classes: tuple[str, ...]
    model_types: tuple[str, ...]
    adapter: type
    tiny: Callable[..., nn.Module]
    tp_plans: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    shapes_samples: Callable[..., dict] | None = None
    shapes: Mapping[str, Callable[[Any], Any]] = field(default_factory=lambda: MappingProxyType({}))
    media_tokens: Mapping[str, Callable[[Any, int, int], int]] = field(default_factory=lambda: MappingProxyType({}))
    video_rules: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def tiny_name(self) -> str:
        return f"tiny-{self.name}"

    @property
    def encoder_stages(self) -> tuple[str, ...]:
        return tuple(self.adapter.ENCODER_STAGES)
