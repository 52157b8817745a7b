"""A stage with no work in a step is left as one process leaves parameters without a gradient.

In one process, a step whose batch has no image never calls the vision tower: its parameters
keep `grad is None`, and torch's optimizers skip them (no moment update, no weight decay, no
step count, so Adam's bias correction stays where it was), while the lr scheduler steps as
usual. Under ds_hetero every rank of such a stage still runs it (a dummy pass whose rows are
multiplied by zero, models/language_stage.empty_rows, so its collectives pair with its peers'),
and DeepSpeed would step the zero gradients: Adam's moments decay, its step count advances, and
the next image steps' updates differ from one process's.

The step plan says which encoder stages have no item in the whole step (StepPlan.idle_encoders:
the same on every rank). Their parameters are held:

- a stage with an engine of its own takes DeepSpeed's overflow path (nothing applied, gradients
  zeroed: clipping.overflow_forced) with the loss scale left alone, and the step is counted as
  DeepSpeed counts an applied one (`skipped_steps` unchanged, the lr scheduler stepped);
- stages sharing one engine (stages/shared_engine.py, ZeRO 0 or 1): a torch optimizer (ZeRO 0)
  sees `grad = None` on the idle stage's parameters and skips them, as in one process; ZeRO 1
  skips the flat parameter groups that hold only idle parameters (the shared engine keeps each
  stage's parameters in groups of their own for this, stages/build.py). A group mixing idle and
  working parameters (none that ds_hetero builds) steps as a whole.

A step whose all-stage norm is not finite is skipped by every engine as before (clipping.py).
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

from torch import nn

from .clipping import instance_attrs, is_zero12, overflow_forced


def hold_step(engine) -> None:
    """`engine.step()` at the accumulation boundary that changes no weight, moment or optimizer
    step count; DeepSpeed's counters and the lr scheduler advance as for an applied step."""
    opt = engine.optimizer
    skipped = engine.skipped_steps
    # ZeRO's overflow path would also lower a dynamic loss scale (and log an overflow): not one
    keep_scale = instance_attrs(opt, _update_scale=lambda has_overflow=False: None) \
        if hasattr(opt, "_update_scale") else contextlib.nullcontext()
    with keep_scale, overflow_forced(engine):
        engine.step()
    engine.skipped_steps = skipped
    if engine.lr_scheduler is not None:
        engine.lr_scheduler.step()


@contextlib.contextmanager
def without(engine, params: Iterable[nn.Parameter]) -> Iterator[None]:
    """Around the engine's step: `params` (those of idle stages sharing the engine) untouched by it."""
    idle = {id(p) for p in params}
    opt = engine.optimizer
    if not is_zero12(opt):  # a torch optimizer skips a parameter without gradient
        for p in engine.module.parameters():
            if id(p) in idle:
                p.grad = None
        yield
        return
    held = {i for i, group in enumerate(opt.bit16_groups) if group and all(id(p) in idle for p in group)}
    stateless = any(not opt.optimizer.state.get(opt.single_partition_of_fp32_groups[i]) for i in held)
    stepped = opt._optimizer_step

    def step_unless_held(group_no):
        if group_no not in held:
            stepped(group_no)

    with instance_attrs(opt, _optimizer_step=step_unless_held):
        yield
    if stateless:  # DeepSpeed links each parameter's view of its group's state once, after the first
        # step: a group held then has none yet, so link again after the next step creates it
        opt._hp_optimizer_states_linked = False
