"""Make a homogeneous run of a `hetero_parallel` config impossible to miss.

DeepSpeed keeps unknown config keys and ignores them: a stock `transformers.Trainer`, a plain
`accelerator.prepare(model)` or a plain `deepspeed.initialize` given our DeepSpeed JSON would
train the whole model with one homogeneous layout and say nothing. Every one of those paths
ends in `deepspeed.initialize` (Accelerate looks the function up on the module at call time),
and ds_hetero's own stage engines never pass the section to it (`HeteroConfig.stage_ds_config`
drops it). So `import ds_hetero` wraps `deepspeed.initialize` once: a config that still carries
`hetero_parallel` raises, on every rank, before DeepSpeed builds anything.

Why patch DeepSpeed's module: it offers no config-validation hook, and this is the only point
all homogeneous paths share. The wrapper changes nothing else (same arguments, same return),
is installed at most once, and keeps the original as `__wrapped__`. A script that never imports
ds_hetero cannot be caught from here (nothing of ours runs in it); HeteroCallback in a stock
Trainer stops it at construction instead.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ..config import SECTION, read_ds_config
from ..errors import HeteroConfigError
from ..topology.mpu import StageMPU
from .inline import ENV

FIX = ("make the Trainer class heterogeneous with one line, `ds_hetero.hetero(SFTTrainer)(...)` in place of "
       "`SFTTrainer(...)` (any Trainer subclass; `ds_hetero.HeteroTrainer` for `transformers.Trainer`), use "
       "`ds_hetero.accelerate.prepare(accelerator, model, ...)` in place of `accelerator.prepare(model, ...)`, "
       "or `ds_hetero.initialize(model, config)` in place of `deepspeed.initialize`")


def _config_of(args: tuple, kwargs: dict) -> Any:
    for key in ("config", "config_params"):
        if kwargs.get(key) is not None:
            return kwargs[key]
    ds_args = kwargs.get("args", args[0] if args else None)
    return getattr(ds_args, "deepspeed_config", None)


def has_hetero_section(config: Any) -> bool:
    if config is None:
        return False
    try:
        return SECTION in read_ds_config(config)
    except (HeteroConfigError, TypeError):  # not ours to judge: DeepSpeed reports its own config errors
        return False


def homogeneous_error(where: str) -> HeteroConfigError:
    return HeteroConfigError(
        SECTION, f"{where} was given a DeepSpeed config with a '{SECTION}' section; DeepSpeed ignores it and "
        f"would train the whole model homogeneously. To train heterogeneously, {FIX}")


def install_deepspeed_guard() -> None:
    import deepspeed

    original = deepspeed.initialize
    if getattr(original, "_ds_hetero_guard", False):
        return

    @functools.wraps(original)
    def initialize(*args, **kwargs):
        if has_hetero_section(_config_of(args, kwargs)):
            raise homogeneous_error("deepspeed.initialize")
        if os.environ.get(ENV, "").strip() and not isinstance(kwargs.get("mpu"), StageMPU):
            # the section given inline (integrations/inline.py); ds_hetero's own stage engines pass a StageMPU
            raise HeteroConfigError(ENV, f"{ENV} is set, but deepspeed.initialize was called outside ds_hetero; "
                                    f"DeepSpeed would train the whole model homogeneously. To train "
                                    f"heterogeneously, {FIX}")
        return original(*args, **kwargs)

    initialize._ds_hetero_guard = True
    deepspeed.initialize = initialize


def remove_deepspeed_guard() -> None:
    import deepspeed

    if getattr(deepspeed.initialize, "_ds_hetero_guard", False):
        deepspeed.initialize = deepspeed.initialize.__wrapped__
