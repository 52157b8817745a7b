"""Write a consolidated Hugging Face checkpoint from full tensors named as the model names them.

    write_hf_checkpoint(save_dir, tensors, model)      one process holds every tensor: one file
    write_weights_file(save_dir, name, tensors, model) several writers, one file each, then
    write_index(save_dir, weight_map, total_size, model)   one writer adds the index and configs

`tensors` maps `model.named_parameters()` / `state_dict()` names to full (unsharded, unpadded)
CPU tensors. The files are what `model.save_pretrained` writes for the same weights: tied
aliases dropped and names reverted to the checkpoint format of the model's class (transformers'
own `remove_tied_weights_from_state_dict` and `revert_weight_conversion`), safetensors with
`{"format": "pt"}` metadata, `config.json` (and `generation_config.json`), and for several
files a `model.safetensors.index.json`; `from_pretrained(save_dir)` loads them.

`model` only supplies the config and the class's name mapping: it may be sharded, partitioned
or on the meta device. Nothing here communicates (the live gather is in hf_gather.py), so
checkpoint conversion tools can call it with tensors read from any source.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

import torch

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"


def shard_file_name(index: int, count: int) -> str:
    """Hugging Face's file name of weights file `index` (0-based) of `count`."""
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def to_checkpoint_names(tensors: Mapping[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """Tied aliases removed, names reverted to the class's checkpoint format (as save_pretrained does).

    The reversion is one-to-one renaming for the families ds_hetero supports, so it can be
    applied to part of the model (one stage's file) at a time.
    """
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = remove_tied_weights_from_state_dict(dict(tensors), model)
    return revert_weight_conversion(model, state)


def write_weights_file(save_dir: str | os.PathLike, file_name: str, tensors: Mapping[str, torch.Tensor],
                       model) -> tuple[dict[str, str], int]:
    """One safetensors file; returns (checkpoint name -> file_name, bytes written)."""
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu").contiguous() for k, v in to_checkpoint_names(tensors, model).items()}
    os.makedirs(save_dir, exist_ok=True)
    save_file(state, os.path.join(os.fspath(save_dir), file_name), metadata={"format": "pt"})
    return {k: file_name for k in state}, sum(v.numel() * v.element_size() for v in state.values())


def write_configs(save_dir: str | os.PathLike, model) -> None:
    model.config.save_pretrained(save_dir)
    if getattr(model, "can_generate", lambda: False)() and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(save_dir)


def write_index(save_dir: str | os.PathLike, weight_map: Mapping[str, str], total_size: int, model) -> None:
    """The index naming each tensor's file, plus config.json (and generation_config.json)."""
    os.makedirs(save_dir, exist_ok=True)
    index = {"metadata": {"total_size": int(total_size)}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(os.fspath(save_dir), INDEX_NAME), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")
    write_configs(save_dir, model)


def write_hf_checkpoint(save_dir: str | os.PathLike, tensors: Mapping[str, torch.Tensor], model) -> None:
    """The whole model in one `model.safetensors` plus its configs."""
    write_weights_file(save_dir, WEIGHTS_NAME, tensors, model)
    write_configs(save_dir, model)
