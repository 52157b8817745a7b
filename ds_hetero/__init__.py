"""ds_hetero: heterogeneous parallelism (per-stage tp/cp/dp layouts) for multimodal training on DeepSpeed.

    import ds_hetero
    engine = ds_hetero.initialize(model, "ds_config.json", training_data=dataset)
    result = engine.train_batch()

    trainer = ds_hetero.hetero(SFTTrainer)(model=model, args=args, ...)   # any HF Trainer class, one line
"""

from . import config as _config
from .config import HeteroConfig
from .engine import HeteroEngine
from .entry import initialize
from .errors import HeteroConfigError
from .layout import Coord, StageLayout
from .weights import WeightsError, meta_model
from .result import StepResult
from .version import __version__
from .families import known_encoder_stages as _known_encoder_stages


def load_config(source, world_size: int) -> HeteroConfig:
    """Read and validate a DeepSpeed config with a `hetero_parallel` section for `world_size` ranks, its
    stage names checked against every model family's (config/parse.py; the families name their stages)."""
    return _config.load_config(source, world_size, _known_encoder_stages())

__all__ = [
    "Coord", "HeteroCallback", "HeteroConfig", "HeteroConfigError", "HeteroEngine", "HeteroTrainer",
    "HeteroTrainerMixin", "StageLayout", "StepResult", "WeightsError", "hetero", "initialize", "load_config",
    "meta_model",
]

# A plain deepspeed.initialize given a hetero_parallel config raises instead of silently training
# homogeneously, and DeepSpeed's CPU shared-memory op is not compiled (inference only, a minute of
# compiling): patches.py lists every process-wide patch and how it is undone.
from .integrations.guard import install_deepspeed_guard  # noqa: E402
from .patches import skip_cpu_shm_comm_build  # noqa: E402

install_deepspeed_guard()
skip_cpu_shm_comm_build()


def __getattr__(name):
    # The Trainer entry points import transformers.Trainer (seconds): only when asked for.
    if name in ("HeteroTrainer", "HeteroCallback", "HeteroTrainerMixin", "hetero"):
        from .integrations.trainer import hf_trainer

        return getattr(hf_trainer, name)
    if name == "accelerate":
        import importlib

        return importlib.import_module(".accelerate", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
