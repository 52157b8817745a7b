"""Per-stage, per-tp-shard construction: a model built on the meta device, filled from a checkpoint.

    model = ds_hetero.meta_model("path/to/hf_checkpoint")         # no storage anywhere
    engine = ds_hetero.initialize(model, "ds_config.json", weights="path/to/hf_checkpoint")

Each rank then allocates and reads only the stages it holds and, within a stage, only its own
tp shard's rows (checkpoint.py reads safetensors slices; shard_slices.py says which rows;
materialize.py fills the modules). `engine.load_report` says, per stage, what was read.
"""

from __future__ import annotations

from ..families.meta import meta_model
from .safetensors_files import SafetensorsCheckpoint, WeightsError
from .materialize import StageLoad, load_stages, loading_device, open_weights
from .shard_slices import ShardSlices, shard_slices


__all__ = [
    "SafetensorsCheckpoint", "ShardSlices", "StageLoad", "WeightsError", "load_stages", "loading_device",
    "meta_model", "open_weights", "shard_slices",
]
