"""How many worker processes read this rank's rows ahead of the step under the Trainer, and how far.

A Trainer script says it with `TrainingArguments.dataloader_num_workers` / `dataloader_prefetch_factor`
(batches per worker, as torch's DataLoader counts them); the DeepSpeed JSON with `hetero_parallel.data_workers`
/ `prefetch_steps` (config/data_keys.py). Either may be given; both, with different worker counts, is an
error naming both, raised at construction on every rank (pure: no communication).
"""

from __future__ import annotations

from typing import Any, Mapping

from ...config.data_keys import parse_data_keys
from ...config.schema import SECTION
from ...errors import HeteroConfigError


def read_ahead(args, section: Mapping[str, Any]) -> tuple[int, int]:
    """(workers, prefetch_steps) for data/prefetch.py's StepPrefetcher."""
    json_workers, json_steps = parse_data_keys(section)
    workers = int(args.dataloader_num_workers or 0)
    if workers and json_workers and workers != json_workers:
        raise HeteroConfigError(
            "TrainingArguments.dataloader_num_workers", f"is {workers}, but the DeepSpeed config's "
            f"{SECTION}.data_workers is {json_workers}: set one of them (both say how many processes per rank "
            f"read this rank's rows ahead)")
    workers = workers or json_workers
    factor = getattr(args, "dataloader_prefetch_factor", None)
    # torch counts prefetch per worker; StepPrefetcher counts steps in all (it gives each worker its share)
    return workers, (workers * int(factor) if workers and factor else json_steps)
