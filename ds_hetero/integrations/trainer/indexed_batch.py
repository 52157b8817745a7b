"""The Trainer's data path for a dataset with a length index (sft_data's SFTDataset, or anything with
`prepare(group)` and `light(i)`): the launcher's reader, under the Trainer.

Of every sample the step plan needs only its token ids, and the index has them without reading a
row, so no rank exchanges ids (rank_batch.py's all_gather is for datasets without an index). Per step:

    1. the light batch from the index (every rank alike), its plan, and this rank's positions:
       its shares by position and those the plan gives it (token-balanced encoders, packed rows),
       exactly what the launcher's engine reads (data/planned_reader.py, the same reader)
    2. the real rows at those positions only, read by data/prefetch.py's StepPrefetcher (through data/planned_reader.py): in
       `workers` DataLoader processes, up to `prefetch_steps` steps ahead, when the step order is
       known ahead (ds_hetero's seeded order); at the step, in this process, otherwise

The order is the sampler's alone, so workers change no loss (0 or N workers: bit-identical).

A row this rank could not read (a bad row, a dead worker, a timeout) must stop every rank alike
before the step's collectives: `build` leaves it in `problem`, which the mixin hands to
`engine.train_batch(..., read_problem=)`, whose batch agreement raises the same error on every rank.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ...data.planned_reader import PlannedReader


def has_length_index(dataset: Any) -> bool:
    """Whether `dataset` gives a row's token ids without reading it (and builds that index collectively)."""
    return hasattr(dataset, "prepare") and hasattr(dataset, "light")


class _StepOrder:
    """What the planned reader reads of a loader: the dataset, step -> dataset indices, the light batch
    from the index, no collate_fn."""

    collate_fn = None

    def __init__(self, dataset, indices: Callable[[int], list[int]]):
        self.dataset, self.indices = dataset, indices

    def light_batch(self, step: int) -> list[dict[str, Any]]:
        return [self.dataset.light(i) for i in self.indices(step)]


class IndexedBatches:
    """Global batches of dataset indices -> the list `engine.train_batch` takes, on this rank.

    `path` is the engine's data_path (this rank's shares, the plan); `step_indices(step)` the dataset
    indices of a step, known ahead (None: only each step's own, given at the step; then no read-ahead)."""

    def __init__(self, path, dataset, step_indices: Callable[[int], list[int]] | None, workers: int,
                 prefetch_steps: int, timeout_s: float):
        self.path, self.dataset, self.step_indices = path, dataset, step_indices
        # workers read steps ahead, so they need the order ahead; without it rows are read at the step
        self.workers = workers if step_indices is not None else 0
        self.prefetch_steps, self.timeout_s = prefetch_steps, timeout_s
        self.rows_prepared = 0  # since construction, this rank (rows read for steps trained)
        self.steps = 0
        self._given: list[int] = []  # the step's indices as the Trainer gave them
        self._reader: PlannedReader | None = None
        self.problem: str | None = None  # why the last build could not read this rank's rows (None: it did)

    def _indices(self, step: int) -> list[int]:
        return self.step_indices(step) if self.step_indices is not None else self._given

    def build(self, indices: Sequence[int], step: int) -> list[dict[str, Any]]:
        """Step `step`'s batch: this rank's positions in full, the others light (token ids from the index)."""
        self._given = [int(i) for i in indices]
        if self.step_indices is not None and self.step_indices(step) != self._given:
            # both come from the same seeded order on every rank: a mismatch is the same on all of them
            raise ValueError(f"step {step}: the Trainer's batch differs from ds_hetero's seeded order for that "
                             f"step (the engine's step count and the Trainer's data position disagree)")
        if self._reader is None:
            self._reader = PlannedReader(self.path, _StepOrder(self.dataset, self._indices), self.workers,
                                         self.prefetch_steps, self.timeout_s)
        batch, _, self.problem, _ = self._reader.next(step)
        self.rows_prepared += sum(1 for sample in batch if not sample.get("light"))
        self.steps += 1
        return batch

    def close(self) -> None:
        """Stops the workers (they read ahead steps that will not be trained)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
