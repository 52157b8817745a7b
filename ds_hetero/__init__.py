"""ds_hetero: heterogeneous parallelism (per-stage tp/cp/dp layouts) for multimodal training on DeepSpeed.

    import ds_hetero
    engine = ds_hetero.initialize(model, "ds_config.json", training_data=dataset)
    result = engine.train_batch()

    trainer = ds_hetero.hetero(SFTTrainer)(model=model, args=args, ...)   # any HF Trainer class, one line

`import ds_hetero` is light (no torch, DeepSpeed or transformers): the runtime is imported on first
use of a name below, so `ds-hetero validate` checks a JSON file in a fraction of a second. The
patches DeepSpeed needs (patches.py) are made the moment DeepSpeed is imported (import_hooks.py).
"""

import importlib as _importlib

from .versions import check_transformers as _check_transformers

_check_transformers()  # before anything reaches into transformers' internals (reads the installed version only)

from . import config as _config  # noqa: E402
from .config import ENCODER_STAGES as _ENCODER_STAGES  # noqa: E402
from .config import HeteroConfig  # noqa: E402
from .errors import HeteroConfigError  # noqa: E402
from .layout import Coord, StageLayout  # noqa: E402
from .result import StepResult  # noqa: E402
from .version import __version__  # noqa: E402


def load_config(source, world_size: int) -> HeteroConfig:
    """Read and validate a DeepSpeed config with a `hetero_parallel` section for `world_size` ranks, its
    stage names checked against every model family's (config/parse.py; the families name their stages)."""
    return _config.load_config(source, world_size, _ENCODER_STAGES)


__all__ = [
    "Coord", "HeteroCallback", "HeteroConfig", "HeteroConfigError", "HeteroEngine", "HeteroTrainer",
    "HeteroTrainerMixin", "StageLayout", "StepResult", "WeightsError", "hetero", "initialize", "load_config",
    "meta_model",
]

# name -> the module that defines it, imported on first use (each pulls in torch and more)
_LAZY = {
    "HeteroEngine": ".engine", "initialize": ".entry", "WeightsError": ".weights", "meta_model": ".weights",
    # the Trainer entry points import transformers.Trainer (seconds)
    "HeteroTrainer": ".integrations.trainer.hf_trainer", "HeteroCallback": ".integrations.trainer.hf_trainer",
    "HeteroTrainerMixin": ".integrations.trainer.hf_trainer", "hetero": ".integrations.trainer.hf_trainer",
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # once
        return value
    if not name.startswith("__"):  # a submodule (ds_hetero.accelerate, ds_hetero.engine, ...), as an eager package had
        try:
            return _importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _patch_deepspeed() -> None:
    # A plain deepspeed.initialize given a hetero_parallel config raises instead of silently training
    # homogeneously, and DeepSpeed's CPU shared-memory op is not compiled (inference only, a minute of
    # compiling): patches.py lists every process-wide patch and how it is undone.
    from .integrations.guard import install_deepspeed_guard
    from .patches import skip_cpu_shm_comm_build

    install_deepspeed_guard()
    skip_cpu_shm_comm_build()


from .import_hooks import when_imported as _when_imported  # noqa: E402

_when_imported("deepspeed", _patch_deepspeed)
