"""Joining the default process group: the one place ds_hetero starts torch.distributed."""

from __future__ import annotations

import atexit
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from ..patches import skip_cpu_shm_comm_build


def ensure_distributed(timeout_s: float) -> tuple[int, int]:
    """Join (or start) the default process group with the accelerator's backend."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    skip_cpu_shm_comm_build()
    if not dist.is_initialized():
        deepspeed.init_distributed(
            dist_backend=get_accelerator().communication_backend_name(), timeout=timedelta(seconds=timeout_s)
        )
    else:  # a process group made by the caller: let DeepSpeed's comm layer wrap it
        deepspeed.init_distributed(dist_backend=dist.get_backend())
    # unregister first: one registration per process however often initialize runs. The backend is
    # taken now: at exit the script (Accelerate's end_training) may have destroyed the default group.
    atexit.unregister(leave_gloo_groups_at_exit)
    atexit.register(leave_gloo_groups_at_exit, dist.get_backend())
    return dist.get_rank(), dist.get_world_size()


# How long a clean gloo exit lets gloo's worker threads finish with their last work (see below).
GLOO_DRAIN_S = 0.2


def leave_gloo_groups_at_exit(backend: str | None = None, drain_s: float = GLOO_DRAIN_S) -> None:
    """At a clean exit with gloo: destroy the process groups, then let gloo's worker threads go idle.

    Why: a gloo worker thread drops its last work, and the tensors in it, just after the collective
    completes. When the script has already dropped those tensors, that last drop frees their Python
    objects and needs the GIL. If the interpreter is being finalized by then, Python 3.11 ends the
    thread inside a noexcept frame and the process aborts with "terminate called without an active
    exception", after a run that finished; the launcher reports it as failed. It is a race, won by
    the finalization when the worker is descheduled at that moment (an oversubscribed CPU machine).

    - Destroying the groups (neither the deepspeed launcher's scripts nor the HF Trainer do) joins
      the workers of every group nothing else holds (torch 2.13, CPU: 20 of 30 two-rank runs of a
      plain all-reduce loop aborted without it, 0 of 30 with it; torch PR 179291 describes this).
    - A training run still holds its groups past that: DeepSpeed's engines hang off their
      parameters' gradient hooks, a cycle through C++ that the garbage collector cannot see, so
      their groups and workers live until the process ends (the CI abort of an Accelerate run, whose
      end_training had already destroyed the groups). Sleeping `drain_s` before the finalization
      releases the GIL and the core, so a pending worker finishes its drop while the interpreter runs.

    Not after an uncaught exception (the interpreter has set `sys.last_value`): destroying a group
    waits for its pending collectives, so a rank that failed mid-step would wait for peers that
    never come instead of exiting and letting the launcher stop the rest. Not with NCCL: its
    shutdown semantics stay the script's choice, as torch documents them.
    """
    if getattr(sys, "last_value", None) is not None:
        return
    if backend is None and dist.is_initialized():
        backend = dist.get_backend()
    if backend != "gloo":  # the default group's backend, so every group's (groups.py)
        return
    if dist.is_initialized():
        dist.destroy_process_group()
    time.sleep(drain_s)
