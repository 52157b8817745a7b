"""`--model`: an HF config.json, a checkpoint directory, or a built-in tiny model, built on meta.

The planner needs the config (shapes) and a model instance for the adapter's divisibility
checks; the instance is built on the meta device, so planning a 70B model allocates nothing.
"""

from __future__ import annotations

import json
import os
from typing import Any

TINY = ("tiny-llava", "tiny-qwen2-vl")


def load_hf_config(source: Any):
    """A transformers config from a built-in name, a config.json, a directory or a config object."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(source, PretrainedConfig):
        return source
    if source in TINY:
        from ..models.tiny import tiny_llava, tiny_qwen2_vl
        import torch

        with torch.device("meta"):
            return (tiny_llava() if source == "tiny-llava" else tiny_qwen2_vl()).config
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
    raise ValueError(f"--model {source!r}: not {', '.join(TINY)}, an existing config.json or a checkpoint directory")


def meta_model(config):
    """The Hugging Face model of `config` on the meta device (no memory, no initialisation)."""
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)
