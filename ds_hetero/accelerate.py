"""`ds_hetero.accelerate.prepare(accelerator, model, ...)` and `log_step`: see integrations/accelerate.py."""

from .integrations.accelerate import log_step, prepare

__all__ = ["log_step", "prepare"]
