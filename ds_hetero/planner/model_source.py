"""`--model`: an HF config.json, a checkpoint directory, or a built-in tiny model, built on meta.

The planner needs the config (shapes) and a model instance for the adapter's divisibility
checks; the instance is built on the meta device, so planning a 70B model allocates nothing.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..families.meta import BUILTIN


def load_hf_config(source: Any):
    """A transformers config from a built-in name, a config.json, a directory or a config object."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(source, PretrainedConfig):
        return source
    if source in BUILTIN:
        from ..families.meta import meta_model as builtin_meta_model

        return builtin_meta_model(source).config
    path = os.fspath(source)
    if os.path.isdir(path):
        return AutoConfig.from_pretrained(path)
    if os.path.isfile(path):
        with open(path) as f:
            data = json.load(f)
        model_type = data.get("model_type")
        if model_type is None:
            raise ValueError(f"{path}: no model_type in the config")
        from transformers import CONFIG_MAPPING

        return CONFIG_MAPPING[model_type].from_dict(data)
    raise ValueError(f"--model {source!r}: not {', '.join(BUILTIN)}, an existing config.json or a checkpoint directory")


def meta_model(config):
    """The Hugging Face model of a config object on the meta device (no memory, no initialisation);
    families/meta.py builds one from a name or a directory, this from a config already read (any
    .json file name, as `--model` accepts). A Qwen2.5-Omni config gives its thinker (the part the
    engine trains)."""
    import torch

    if str(getattr(config, "model_type", "")) in ("qwen2_5_omni", "qwen2_5_omni_thinker"):
        from transformers import Qwen2_5OmniThinkerForConditionalGeneration

        from ..families.qwen2_5_omni.shapes import thinker

        with torch.device("meta"):
            return Qwen2_5OmniThinkerForConditionalGeneration._from_config(thinker(config))
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)


def load_model(model: Any, build: bool = True):
    """(HF config, a model for the adapter's checks) of `--model` or a model instance: the instance
    itself, else built on the meta device (None when not `build`)."""
    if hasattr(model, "config") and hasattr(model, "parameters"):
        return model.config, model
    cfg = load_hf_config(model)
    return cfg, meta_model(cfg) if build else None
