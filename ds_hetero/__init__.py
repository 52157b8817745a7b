"""ds_hetero: heterogeneous parallelism (per-stage tp/cp/dp layouts) for multimodal training on DeepSpeed.

    import ds_hetero
    engine = ds_hetero.initialize(model, "ds_config.json", training_data=dataset)
    result = engine.train_batch()
"""

from .config import HeteroConfig, load_config
from .engine import HeteroEngine, initialize
from .errors import HeteroConfigError
from .layout import Coord, StageLayout
from .loading import WeightsError, meta_model
from .result import StepResult

__all__ = [
    "Coord", "HeteroConfig", "HeteroConfigError", "HeteroEngine", "StageLayout", "StepResult",
    "WeightsError", "initialize", "load_config", "meta_model",
]
__version__ = "0.1.0"
