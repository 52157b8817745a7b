"""`ds_hetero.accelerate.prepare(accelerator, model, ...)` and `log_step`: see integrations/accelerate_prepare.py."""

from .integrations.accelerate_prepare import log_step, prepare

__all__ = ["log_step", "prepare"]
