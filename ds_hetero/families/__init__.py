"""The model families ds_hetero trains, one home each (families/<family>/, see family.py), listed once here.

Adding a family is its home plus one line in FAMILIES. Everything outside the homes reaches a family
through this registry: the adapter of a model instance (`adapter_for`), the merged tensor-parallel plans
(`tp_plans`), the encoder stages a config may name (`known_encoder_stages`), the built-in tiny models
(`tiny_model`, meta.py), the shapes data in a family's format (`family_of_config`), an image's token count
by a processor's resize rule (`image_token_rule`) and the settings a processor's video clips are read by
(`video_settings_of`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Sequence

from ..models.adapter import StageAdapter
from .family import Family
from .gemma3 import FAMILY as GEMMA3
from .gemma4 import FAMILY as GEMMA4
from .internvl import FAMILY as INTERNVL
from .llava import FAMILY as LLAVA
from .llava_onevision import FAMILY as LLAVA_ONEVISION
from .qwen2_5_omni import FAMILY as QWEN2_5_OMNI
from .qwen2_5_vl import FAMILY as QWEN2_5_VL
from .qwen2_vl import FAMILY as QWEN2_VL
from .qwen3_5 import FAMILY as QWEN3_5
from .qwen3_5_moe import FAMILY as QWEN3_5_MOE
from .qwen3_vl import FAMILY as QWEN3_VL
from .qwen3_vl_moe import FAMILY as QWEN3_VL_MOE
from .refused import REFUSED, refusal
from .shared_plans import TP_PLANS as SHARED_TP_PLANS

FAMILIES: tuple[Family, ...] = (
    LLAVA,
    QWEN2_VL,
    QWEN2_5_VL,
    QWEN3_VL,
    QWEN3_VL_MOE,
    GEMMA3,
    INTERNVL,
    LLAVA_ONEVISION,
    QWEN2_5_OMNI,
    QWEN3_5,
    QWEN3_5_MOE,
    GEMMA4,
)


def tp_plans(families: Sequence[Family] = FAMILIES) -> Mapping[str, object]:
    """Every family's tensor-parallel plans and the shared decoders' and towers', merged: a family's model may
    hold another family's decoder or tower (a LLaVA with a Qwen2 decoder), and plans are keyed by class."""
    merged = dict(SHARED_TP_PLANS)
    for family in families:
        merged.update(family.tp_plans)
    return MappingProxyType(merged)


def family_of(model, families: Sequence[Family] = FAMILIES) -> Family:
    """The family of a Hugging Face model instance (by class name along its MRO), or TypeError saying why not."""
    by_class = {name: family for family in families for name in family.model_classes}
    for cls in type(model).__mro__:
        if cls.__name__ in by_class:
            return by_class[cls.__name__]
        if cls.__name__ in REFUSED:
            raise TypeError(refusal(cls.__name__))
    raise TypeError(f"ds_hetero has no stage adapter for {type(model).__name__}; supported: {', '.join(sorted(by_class))}")


def adapter_for(model, families: Sequence[Family] = FAMILIES) -> StageAdapter:
    """The stage adapter of a Hugging Face multimodal model instance, with every family's tp plans."""
    adapter = family_of(model, families).adapter(model)
    adapter.tp_plans = tp_plans(families)
    return adapter


def family_of_config(config, families: Sequence[Family] = FAMILIES) -> Family:
    """The family of a Hugging Face config (by `model_type`)."""
    for family in families:
        if config.model_type in family.model_types:
            return family
    known = sorted(t for f in families for t in f.model_types)
    raise ValueError(f"no model family for model_type {config.model_type!r}; known: {', '.join(known)}")


def known_encoder_stages(families: Sequence[Family] = FAMILIES) -> tuple[str, ...]:
    """Every encoder stage some model family has (what a config may name without a model)."""
    return tuple(dict.fromkeys(name for family in families for name in family.encoder_stages))


def family_named(name: str, families: Sequence[Family] = FAMILIES) -> Family:
    """A family by its user-facing name (`--model-family`)."""
    for family in families:
        if family.name == name:
            return family
    raise ValueError(f"no model family {name!r}; known: {', '.join(f.name for f in families)}")


__all__ = ["FAMILIES", "Family", "adapter_for", "family_named", "family_of", "family_of_config",
           "known_encoder_stages", "tp_plans"]


def image_token_rule(processor, families: Sequence[Family] = FAMILIES):
    """`(height, width) -> placeholder tokens` of an image under `processor`, without its pixels: the rule of
    the family that lists the processor's class (along its MRO), else transformers' generic
    `_get_num_multimodal_tokens` where the processor has one, else None (the length index then encodes)."""
    by_class = {name: rule for family in families for name, rule in family.media_tokens.items()}
    for cls in type(processor).__mro__:
        if cls.__name__ in by_class:
            rule = by_class[cls.__name__]
            return lambda height, width: rule(processor, height, width)
    if hasattr(processor, "_get_num_multimodal_tokens"):
        def generic(height: int, width: int) -> int:
            data = processor._get_num_multimodal_tokens(image_sizes=[(height, width)])
            return int(data["num_image_tokens"][0])
        return generic
    return None


def video_settings_of(processor, families: Sequence[Family] = FAMILIES):
    """The VideoSettings (qwen2_vl/video_frames.py) `processor`'s clips are sampled, resized and patchified by: the
    rule of the family that lists the processor's class (along its MRO), read from its video processor; None when
    no family reads videos for it."""
    from .qwen2_vl.video_frames import video_settings

    by_class = {name: rule for family in families for name, rule in family.video_rules.items()}
    for cls in type(processor).__mro__:
        if cls.__name__ in by_class:
            return video_settings(processor, by_class[cls.__name__])
    return None
