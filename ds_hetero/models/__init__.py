"""What every model family shares: the adapter interface (adapter.py), the language stage (language_stage.py),
freezing and recompute per stage, the cost of an encoder item, labels. The families themselves, and the
registry that finds a model's adapter, are in ds_hetero/families/."""

from .adapter import IGNORE_INDEX, EncoderPort, StageAdapter

__all__ = ["IGNORE_INDEX", "EncoderPort", "StageAdapter"]
