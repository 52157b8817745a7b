"""ds_hetero: heterogeneous parallelism (per-stage tp/cp/dp layouts) for multimodal training on DeepSpeed.

    import ds_hetero
    engine = ds_hetero.initialize(model, "ds_config.json", training_data=dataset)
    result = engine.train_batch()

    trainer = ds_hetero.hetero(SFTTrainer)(model=model, args=args, ...)   # any HF Trainer class, one line
"""

from .versions import check_transformers as _check_transformers

_check_transformers()  # before anything reaches into transformers' internals

from . import config as _config  # noqa: E402
from .config import HeteroConfig  # noqa: E402
from .engine import HeteroEngine  # noqa: E402
from .entry import initialize  # noqa: E402
from .errors import HeteroConfigError  # noqa: E402
from .layout import Coord, StageLayout  # noqa: E402
from .weights import WeightsError, meta_model  # noqa: E402
from .result import StepResult  # noqa: E402
from .version import __version__  # noqa: E402
from .families import known_encoder_stages as _known_encoder_stages  # noqa: E402


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
