"""This rank's samples of the next steps, read ahead by worker processes while the current step runs.

    ahead = StepPrefetcher(loader, positions_of, start_step=k, workers=2, prefetch_steps=2, timeout_s=300)
    full, problem, waited = ahead.next(k)    # {position: sample} of step k, or the reason it could not be read

torch's DataLoader does the worker mechanics: one batch is one step's rows for this rank (the positions
`positions_of(step)` names, computed here in the main process from the light batch: the plan needs no
image), so with N workers N steps are encoded side by side, and at most `prefetch_steps` steps ahead of
the one the engine asks for. The order of samples is the loader's (seed, step) alone, so the workers
change nothing a step computes: the losses with 0 or N workers are bit-identical.

A row that fails in a worker (a bad row, a collator error) comes back as the step's `problem`, which the
engine hands to the batch agreement, so every rank raises the same error before any collective of that
step. A worker that dies, or a read slower than `timeout_s`, is reported as the step's problem too, never
a hang; the next `next()` starts fresh workers at the asked step. `workers=0` reads in the main process, at
the step, as before.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader, Dataset


class _Rows(Dataset):
    """One (dataset index, batch position) -> (position, sample) or (position, the error's text)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, request: tuple[int, int]) -> tuple[int, Any, str | None]:
        index, position = request
        try:
            return position, self.dataset[index], None
        except Exception as exc:  # noqa: BLE001 -- any row error becomes the step's problem on every rank
            return position, None, f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)


class _StepRequests:
    """The batch sampler: step after step from `start`, this rank's (index, position) pairs of the step."""

    def __init__(self, indices_of: Callable[[int], list[int]], positions_of: Callable[[int], set[int]], start: int):
        self.indices_of, self.positions_of, self.start = indices_of, positions_of, start

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        step = self.start
        while True:
            indices = self.indices_of(step)
            yield [(indices[p], p) for p in sorted(self.positions_of(step))]
            step += 1


class _Collate:
    """A step's rows: the user's collate_fn over the items (items -> per-sample dicts) if one is given."""

    def __init__(self, collate_fn):
        self.collate_fn = collate_fn

    def __call__(self, rows: list[tuple[int, Any, str | None]]) -> tuple[dict[int, Any], str | None]:
        errors = [e for _, _, e in rows if e is not None]
        if errors:
            return {}, errors[0]
        positions, items = [p for p, _, _ in rows], [s for _, s, _ in rows]
        if self.collate_fn is not None and items:
            try:
                items = self.collate_fn(items)
            except Exception as exc:  # noqa: BLE001
                return {}, f"collate_fn: {type(exc).__name__}: {exc}"
        return dict(zip(positions, items)), None


class StepPrefetcher:
    def __init__(self, loader, positions_of: Callable[[int], set[int]], start_step: int, workers: int,
                 prefetch_steps: int, timeout_s: float):
        self.loader, self.positions_of = loader, positions_of
        self.workers, self.prefetch_steps, self.timeout_s = workers, prefetch_steps, timeout_s
        self._start(start_step)

    def _start(self, step: int) -> None:
        kwargs: dict[str, Any] = {}
        if self.workers:
            kwargs = dict(num_workers=self.workers, timeout=self.timeout_s, persistent_workers=False,
                          prefetch_factor=max(1, math.ceil(self.prefetch_steps / self.workers)))
        self._dataloader = DataLoader(_Rows(self.loader.dataset), batch_sampler=_StepRequests(
            self.loader.indices, self.positions_of, step), collate_fn=_Collate(self.loader.collate_fn), **kwargs)
        self._iter = iter(self._dataloader)
        self.next_step = step

    def next(self, step: int) -> tuple[dict[int, Any], str | None, float]:
        """Step `step`'s samples at this rank's positions, the problem that stopped them (or None), and the
        seconds this call waited for them."""
        if step != self.next_step:  # a resume, or a retry after a failed step: read from `step` on
            self.close()
            self._start(step)
        start = time.perf_counter()
        try:
            full, problem = next(self._iter)
            self.next_step = step + 1
        except Exception as exc:  # noqa: BLE001 -- a dead worker or a timeout: reported, then fresh workers
            full, problem = {}, f"reading step {step}'s rows failed: {type(exc).__name__}: {exc}"
            self.close()
            self.next_step = -1
        return full, problem, time.perf_counter() - start

    def close(self) -> None:
        it = getattr(self, "_iter", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._iter = None
