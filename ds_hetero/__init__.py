"""ds_hetero: heterogeneous parallelism (per-stage tp/cp/dp layouts) for multimodal training on DeepSpeed."""

from .errors import HeteroConfigError
from .layout import Coord, StageLayout

__all__ = ["Coord", "HeteroConfigError", "StageLayout"]
__version__ = "0.1.0"
