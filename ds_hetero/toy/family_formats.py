"""The shapes-captioning dataset in the sample format of each supported model family.

`shapes_dataset_for(model_config, size, seed)` picks the format by the config's `model_type`, from the
family's home (ds_hetero/families/<family>/sample_format.py).
"""

from __future__ import annotations

from .shapes import ShapesCaptionDataset


def shapes_dataset_for(model_config, size: int, seed: int = 0, **kwargs) -> ShapesCaptionDataset:
    """The shapes dataset in the sample format of the model family of `model_config`."""
    return ShapesCaptionDataset.for_model(model_config, size, seed=seed, **kwargs)
