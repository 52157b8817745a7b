"""A model's shapes without its weights: built on the meta device from its config.

`ds-hetero validate --model NAME_OR_PATH` runs the model-level checks (heads, kv heads, MLP
width, vocabulary against each stage's tp) on such a model: no weights are read or allocated,
and nothing is downloaded. `ds_hetero.initialize(meta_model(DIR), cfg, weights=DIR)` then fills
it per stage and per tp shard (ds_hetero/weights/).
"""

from __future__ import annotations

import os

import torch

from ..errors import HeteroConfigError
from . import FAMILIES

# every family's tiny model (families/<family>/tiny.py), by its built-in name
BUILTIN = tuple(family.tiny_name for family in FAMILIES)


def builtin_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A built-in tiny model by name (on the current default device), seeded."""
    build = {family.tiny_name: family.tiny for family in FAMILIES}
    if name not in build:
        raise HeteroConfigError("--model", f"{name!r} is not a built-in model; built-in: {', '.join(BUILTIN)}")
    return build[name](seed=seed)


def meta_model(name_or_path, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A built-in tiny model's name, a Hugging Face checkpoint directory, its config.json, or a
    config object; `dtype` that of its parameters (default: torch's default dtype)."""
    if not isinstance(name_or_path, (str, os.PathLike)):  # a transformers config
        from transformers import AutoModelForImageTextToText

        with torch.device("meta"):
            return AutoModelForImageTextToText.from_config(name_or_path, **({} if dtype is None else {"dtype": dtype}))
    if name_or_path in BUILTIN:
        with torch.device("meta"):
            return builtin_model(name_or_path)
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
            return AutoModelForImageTextToText.from_config(config, **({} if dtype is None else {"dtype": dtype}))
    except ValueError as exc:  # a config no image-text-to-text class takes
        raise HeteroConfigError("--model", f"{name_or_path!r}: {exc}") from None
