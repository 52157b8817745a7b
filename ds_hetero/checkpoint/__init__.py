"""Checkpoints of a HeteroEngine: a manifest per checkpoint, atomic publication, loading into
another layout, and Hugging Face export.

    engine.save_checkpoint(DIR)          # DIR/<tag>/{manifest.json, vision/, language/}, then DIR/latest
    engine.load_checkpoint(DIR)          # same layout: DeepSpeed's own load (exact);
                                         # another layout: resharded through per-parameter full tensors
    engine.save_pretrained(OUT)          # consolidated Hugging Face checkpoint from the live engine

    manifest.py      what a checkpoint records (layouts, step, data position, versions, parameters)
    publish.py       temporary name -> barrier -> one rename; the kill-point test hook
    layer_map.py     a pipelined stage's files per chunk, and its chunks' layers <-> the model's names
    full_state.py    a stage's DeepSpeed files (any tp, dp, pp, ZeRO 0/1/2) -> full per-parameter tensors
    reshard.py       full per-parameter tensors -> a live stage engine of any layout
    expert_state.py  a stage with experts sharded over ep: its files (gathered live by name) <-> the full state
    store.py         save / load orchestration used by HeteroEngine
    hf_export.py     full tensors -> Hugging Face files (the one writer of save_pretrained and convert)
    hf_gather.py     save_pretrained: the live gather feeding hf_export
    hf_convert.py    `ds-hetero checkpoint convert DIR --to-hf OUT`: full_state -> hf_export
    commands.py      `ds-hetero checkpoint info / convert`
"""

from .manifest import CheckpointError, read_manifest
from .store import load_checkpoint, save_checkpoint

__all__ = ["CheckpointError", "load_checkpoint", "read_manifest", "save_checkpoint"]
