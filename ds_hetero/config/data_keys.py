"""`hetero_parallel.data_workers` and `prefetch_steps`: how a rank reads its share of the training data
ahead of the step (data/prefetch.py, docs/real-data.md). Pure: every rank raises the same error.

    "data_workers": 0     worker processes per rank that read and encode this rank's samples of the
                          next steps while the current one runs (0: read in the step, on the main
                          process: torch's DataLoader default)
    "prefetch_steps": 2   steps read ahead of the current one, at most (with workers)

Neither changes what a step computes: the order of samples is (seed, step) alone.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import HeteroConfigError
from .schema import SECTION

DEFAULT_PREFETCH_STEPS = 2


def _count(section: Mapping[str, Any], key: str, default: int, least: int, what: str) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise HeteroConfigError(f"{SECTION}.{key}", f"must be an integer >= {least} ({what}), got {value!r}")
    return value


def parse_data_keys(section: Mapping[str, Any]) -> tuple[int, int]:
    """(data_workers, prefetch_steps) of the section, checked."""
    workers = _count(section, "data_workers", 0, 0, "worker processes per rank reading the next steps' samples")
    prefetch = _count(section, "prefetch_steps", DEFAULT_PREFETCH_STEPS, 1, "steps read ahead by the data workers")
    return workers, prefetch
