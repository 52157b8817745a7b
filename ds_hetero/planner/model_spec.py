"""The planner's door to a model's shapes: the family's reader, looked up by the HF config's `model_type`.

    spec = model_spec(config)          # a ModelSpec (shapes.py): its encoders and language model
"""

from __future__ import annotations

from typing import Any

from .family_shapes import READERS
from .shapes import ModelSpec, get


def model_spec(cfg: Any) -> ModelSpec:
    """The shapes of a config of a family the planner knows (a transformers config object or its dict)."""
    model_type = str(get(cfg, "model_type", ""))
    reader = READERS.get(model_type)
    if reader is None:
        raise ValueError(f"the planner knows {', '.join(sorted(READERS))} configs, got model_type {model_type!r}")
    return reader(cfg)
