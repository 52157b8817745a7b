"""Startup lines: what a job is doing before its first step, and how long each phase took.

The library logs each phase to the `ds_hetero.startup` logger (`PhaseClock`, a local object of the
function that builds: no module state). Nothing prints them unless an entry point asks with
`show_startup()` on the rank that reports (the recipes: rank 0), so library users keep their own
logging untouched. Each line shows the seconds since the process started and the phase's own:

    ds_hetero startup  12.3 s  stage process groups built (0.2 s)
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import IO

LOGGER = "ds_hetero.startup"


class PhaseClock:
    """`done(what)` logs `what` with the seconds since the previous `done` (or since the clock was made)."""

    def __init__(self):
        self.last = time.perf_counter()

    def done(self, what: str) -> None:
        now = time.perf_counter()
        logging.getLogger(LOGGER).info("%s (%.1f s)", what, now - self.last)
        self.last = now

    def note(self, what: str) -> None:
        """A line without a duration (what was done before the clock existed: the imports); restarts the clock."""
        logging.getLogger(LOGGER).info("%s", what)
        self.last = time.perf_counter()


def process_start() -> float:
    """When this process started (time.time() scale): the launcher's spawn, not our first import."""
    try:
        import psutil  # a DeepSpeed requirement

        return psutil.Process().create_time()
    except Exception:  # psutil missing or no /proc: count from now
        return time.time()


class _SinceStart(logging.Formatter):
    def __init__(self, start: float):
        super().__init__()
        self.start = start

    def format(self, record: logging.LogRecord) -> str:
        return f"ds_hetero startup {record.created - self.start:6.1f} s  {record.getMessage()}"


def show_startup(stream: IO[str] | None = None, start: float | None = None) -> None:
    """Print the `ds_hetero.startup` lines of this process on `stream` (stdout). Idempotent: a recipe's
    main() called twice in one process (tests) prints each line once."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the lines are for the person watching, not for the application's root handlers
    if any(getattr(h, "_ds_hetero_startup", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(_SinceStart(process_start() if start is None else start))
    handler._ds_hetero_startup = True
    logger.addHandler(handler)


def first_line(script: str, importing: str, unit: str = "rank(s)") -> None:
    """Rank 0's first line (RANK from the launcher), printed before the imports that take seconds on every
    rank, so a person sees the job start within a second or two of the launch."""
    if os.environ.get("RANK", "0") == "0":
        print(f"ds_hetero: {os.path.basename(script)} starting on {os.environ.get('WORLD_SIZE', '1')} {unit}, "
              f"importing {importing}", flush=True)


# DeepSpeed logs this from every process that imports it on a machine without a GPU (6 times under
# the launcher for the main job); the entry points say it once instead (device_note).
CPU_ACCELERATOR_MESSAGE = "Setting accelerator to CPU"


def _not_the_cpu_accelerator_message(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(CPU_ACCELERATOR_MESSAGE)


def hide_cpu_accelerator_message() -> None:
    """Leave DeepSpeed's per-process CPU-accelerator message out of this process's output. A filter on
    DeepSpeed's logger, set by a script before it imports DeepSpeed: DeepSpeed is not patched, and a
    library user's own scripts see its logging unchanged. One filter function, so calling twice adds it once."""
    logging.getLogger("DeepSpeed").addFilter(_not_the_cpu_accelerator_message)


def startup_line(what: str, start: float | None = None) -> str:
    """The first line an entry point prints, before its heavy imports (torch, DeepSpeed)."""
    since = time.time() - (process_start() if start is None else start)
    return f"ds_hetero startup {since:6.1f} s  {what}"


# What the launchers print before our code runs (other processes: nothing to filter there), explained
# once by rank 0. The entry points themselves leave out DeepSpeed's "Setting accelerator to CPU"
# (hide_cpu_accelerator_message) and say "no GPU" once here instead.
LAUNCHER_NOTE = ("expected launcher lines on one machine: 'Unable to find hostfile' (local ranks used), "
                 "'Setting CUDA_VISIBLE_DEVICES' (set even without a GPU), 'OMP_NUM_THREADS' (1 thread per rank)")


def device_note(device_type: str) -> str:
    """`no GPU: DeepSpeed's CPU accelerator, gloo collectives` on CPU; the device type elsewhere."""
    if device_type == "cpu":
        return "no GPU found: training on CPU (DeepSpeed's CPU accelerator, gloo collectives)"
    return f"device: {device_type}"
