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

# ds_hetero/models/tiny.py and tiny_families.py, with their default sizes
BUILTIN = ("tiny-llava", "tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl", "tiny-gemma3", "tiny-internvl",
           "tiny-llava-onevision", "tiny-qwen2.5-omni", "tiny-qwen3-vl-moe")


def builtin_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A built-in tiny model by name (on the current default device), seeded."""
    from .tiny import tiny_llava, tiny_qwen2_5_omni, tiny_qwen2_vl
    from .qwen3_vl_moe import tiny_qwen3_vl_moe
    from .tiny_families import tiny_gemma3, tiny_internvl, tiny_llava_onevision, tiny_qwen2_5_vl, tiny_qwen3_vl

    build = {"tiny-llava": tiny_llava, "tiny-qwen2-vl": tiny_qwen2_vl, "tiny-qwen2.5-vl": tiny_qwen2_5_vl,
             "tiny-qwen3-vl": tiny_qwen3_vl, "tiny-gemma3": tiny_gemma3, "tiny-internvl": tiny_internvl,
             "tiny-llava-onevision": tiny_llava_onevision, "tiny-qwen2.5-omni": tiny_qwen2_5_omni,
             "tiny-qwen3-vl-moe": tiny_qwen3_vl_moe}
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
