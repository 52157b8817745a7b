"""The planner's door to a model's shapes: its family's reader (families/<family>/shapes.py), looked up in
the family registry by the HF config's `model_type`.

    spec = model_spec(config)          # a ModelSpec (models/shapes.py): its encoders and language model
"""

from __future__ import annotations

from typing import Any

from ..families import FAMILIES
from ..models.shapes import ModelSpec, get


def model_spec(cfg: Any) -> ModelSpec:
    """The shapes of a config of a family the planner knows (a transformers config object or its dict)."""
    readers = {model_type: read for family in FAMILIES for model_type, read in family.shapes.items()}
    model_type = str(get(cfg, "model_type", ""))
    if model_type not in readers:
        raise ValueError(f"the planner knows {', '.join(sorted(readers))} configs, got model_type {model_type!r}")
    return readers[model_type](cfg)
