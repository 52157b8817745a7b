"""A ds_hetero checkpoint (any layout) -> a consolidated Hugging Face checkpoint, from files alone.

    convert_to_hf("ckpt", "hf_out")      # == `ds-hetero checkpoint convert ckpt --to-hf hf_out`

Each stage is merged to full tensors by the reader a layout change uses (full_state.py: fp32
master weights, merged over ZeRO partitions and tp shards), keyed by the model's own names
(params.json), cast to the dtype the run trained in, and written as one safetensors file per
stage by the same writer as `HeteroEngine.save_pretrained` (hf_export.py). The model object the
writer needs for its config and name mapping is built on the meta device from the manifest:
no weights are allocated for it.
"""

from __future__ import annotations

import os

import torch

from .full_state import stage_full_state
from .manifest import CheckpointError, read_manifest, resolve_tag


def meta_model(manifest: dict):
    """The checkpoint's Hugging Face model class and config, on the meta device."""
    import transformers
    from transformers import CONFIG_MAPPING

    info = manifest["model"]
    cls = getattr(transformers, info["class"], None)
    if cls is None:
        raise CheckpointError(f"transformers {transformers.__version__} has no model class {info['class']!r}")
    config = CONFIG_MAPPING[info["config"]["model_type"]].from_dict(info["config"])
    with torch.device("meta"):
        return cls(config)


def convert_to_hf(load_dir: str | os.PathLike, out_dir: str | os.PathLike, tag: str | None = None) -> str:
    from .hf_export import shard_file_name, write_index, write_weights_file

    load_dir, out_dir = os.fspath(load_dir), os.fspath(out_dir)
    tag = resolve_tag(load_dir, tag)
    manifest = read_manifest(load_dir, tag)
    ckpt_dir = os.path.join(load_dir, tag)
    model = meta_model(manifest)
    expected = {n for n, _ in model.named_parameters()}
    dtype = getattr(torch, manifest["dtype"])
    weight_map: dict[str, str] = {}
    total, written = 0, set()
    stages = list(manifest["stages"])
    for i, stage in enumerate(stages):
        state = stage_full_state(ckpt_dir, stage, manifest)["params"]  # keyed by the model's names
        tensors = {name: entry["fp32"].to(dtype) for name, entry in state.items()}
        written |= set(tensors)
        files, size = write_weights_file(out_dir, shard_file_name(i, len(stages)), tensors, model)
        weight_map.update(files)
        total += size
    missing = expected - written
    if missing:
        raise CheckpointError(f"{ckpt_dir}: the stages hold no value for {sorted(missing)[:5]} "
                              f"({len(missing)} parameters of {manifest['model']['class']})")
    write_index(out_dir, weight_map, total, model)
    return out_dir
