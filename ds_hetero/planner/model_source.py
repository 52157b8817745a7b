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
    .json file name, as `--model` accepts)."""
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)
