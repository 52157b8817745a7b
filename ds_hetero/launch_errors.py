"""A launched script's config error, printed once: whole by rank 0, one line by every other rank.

A HeteroConfigError depends only on the config, the world size and what every rank sees, and is
raised before any collective: every rank of the job has the same one, so rank 0 is the lowest rank
that has it and says it whole. Without this, the DeepSpeed launcher shows one full traceback per
rank, interleaved. No collective is used (the ranks that failed may not have a process group yet).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

from .errors import HeteroConfigError

# The DeepSpeed launcher kills every rank as soon as one exits non-zero; the other ranks wait this
# long before exiting so that rank 0 has printed first.
OTHER_RANKS_WAIT_S = 3.0


def report_config_error(exc: HeteroConfigError, rank: int | None = None, stream=None) -> int:
    """Print `exc` as this rank should (see the module docstring); the exit code, 1."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    stream = sys.stderr if stream is None else stream
    if rank == 0:
        print(f"error: {exc}", file=stream, flush=True)
    else:
        print(f"rank {rank}: stopped by the config error rank 0 prints", file=stream, flush=True)
        time.sleep(OTHER_RANKS_WAIT_S)
    return 1


def exit_code_of(main: Callable[[], int]) -> int:
    """`main()`'s exit code; a config error reported once (report_config_error) instead of a traceback per rank."""
    try:
        return main()
    except HeteroConfigError as exc:
        return report_config_error(exc)
