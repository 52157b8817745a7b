"""Step k's batch on this rank: planned from the light batch, this rank's rows read (ahead, by workers).

    reader = PlannedReader(path, loader, workers=2, prefetch_steps=2, timeout_s=300)
    batch, plan, problem, waited = reader.next(k)   # this rank's rows in full, the others light

One reader under every entry (the engine's own loader, the Trainer's indexed datasets): the step's
light batch (token ids only, from a length index) is planned once, in this process, when the reader
asks which positions to read (`positions_of`); the plan is kept for the step, so the engine does not
plan it again. The positions are the data path's (step/rank_data.py `read_positions`); the rows come
from prefetch.py's StepPrefetcher.

`loader` gives `dataset`, `indices(step)`, `light_batch(step)` and `collate_fn` (data/loader.py's
GlobalBatchLoader is one).
"""

from __future__ import annotations

from typing import Any

from .prefetch import StepPrefetcher


class PlannedReader:
    def __init__(self, path, loader, workers: int, prefetch_steps: int, timeout_s: float):
        self.path, self.loader = path, loader
        self.workers, self.prefetch_steps, self.timeout_s = workers, prefetch_steps, timeout_s
        self._prefetcher: StepPrefetcher | None = None  # started at the first next()
        self._planned: dict[int, tuple[list, Any]] = {}  # step -> (light batch, plan), planned ahead

    def positions_of(self, step: int) -> set[int]:
        """Positions this rank reads in full in `step` (asked by the prefetcher, ahead of the step)."""
        light = self.loader.light_batch(step)
        plan = self.path.plan_of(light)
        self._planned[step] = (light, plan)
        return self.path.read_positions(plan)

    def next(self, step: int) -> tuple[list[dict[str, Any]], Any, str | None, float]:
        """(step's batch: this rank's positions in full, the rest light; its plan (None: malformed); why this
        rank could not read its rows (None: it did); seconds waited for them)."""
        if self._prefetcher is None:
            self._prefetcher = StepPrefetcher(self.loader, self.positions_of, step, self.workers,
                                              self.prefetch_steps, self.timeout_s)
        full, problem, waited = self._prefetcher.next(step)
        if step not in self._planned:  # the reader failed before planning it
            self.positions_of(step)
        light, plan = self._planned.pop(step)
        for old in [k for k in self._planned if k < step]:  # steps read ahead of a restart, never asked for
            del self._planned[old]
        return [full.get(p, sample) for p, sample in enumerate(light)], plan, problem, waited

    def close(self) -> None:
        """Stops the workers (they read ahead steps that will not be trained)."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        self._planned.clear()
