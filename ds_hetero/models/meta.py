"""A model's shapes without its weights: built on the meta device from its config, for checks.

`ds-hetero validate --model NAME_OR_PATH` runs the model-level checks (heads, kv heads, MLP
width, vocabulary against each stage's tp) on such a model: no weights are read or allocated,
and nothing is downloaded.
"""

from __future__ import annotations

import os

import torch

from ..errors import HeteroConfigError

BUILTIN = ("tiny-llava", "tiny-qwen2-vl")  # ds_hetero/models/tiny.py, with their default sizes


def meta_model(name_or_path: str) -> torch.nn.Module:
    """A built-in tiny model's name, a Hugging Face checkpoint directory, or its config.json."""
    if name_or_path in BUILTIN:
        from .tiny import tiny_llava, tiny_qwen2_vl

        with torch.device("meta"):
            return tiny_llava() if name_or_path == "tiny-llava" else tiny_qwen2_vl()
    path = os.fspath(name_or_path)
    if os.path.isfile(path) and os.path.basename(path) == "config.json":
        path = os.path.dirname(path) or "."
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise HeteroConfigError(
            "--model", f"{name_or_path!r} is neither a built-in model ({', '.join(BUILTIN)}) nor a directory "
            "holding a Hugging Face config.json (nothing is downloaded)")
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    try:
        with torch.device("meta"):
            return AutoModelForImageTextToText.from_config(config)
    except ValueError as exc:  # a config no image-text-to-text class takes
        raise HeteroConfigError("--model", f"{name_or_path!r}: {exc}") from None
