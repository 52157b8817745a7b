"""The global batches of a map-style dataset, read on each rank only as far as that rank needs.

Every rank walks the same seeded order of sample indices, so every rank agrees on which
samples form step k's global batch. A rank materialises in full (image fields included) only
the samples its stages handle; for every other sample it needs just the token ids, to know the
sample's image-token count for the boundary plan. A dataset that can give those cheaply
implements `light(index)` (the real-data length index, sft_data/) or `input_ids(index)` (the toy
sets); otherwise the full item is read and its image fields dropped. A dataset with a `prepare(group)`
(sft_data's: its length index, measured by all ranks together) is prepared first, on every rank.
The full samples are read ahead by worker processes (prefetch.py) where the config asks for them.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


def prepare_dataset(dataset: Any, group) -> Any:
    """The dataset after its `prepare(group)` where it has one (collective over `group`: every rank calls it)."""
    if hasattr(dataset, "prepare"):
        dataset.prepare(group)
    return dataset


class GlobalBatchLoader:
    """Step k's global batch as a list of per-sample dicts (`light` dicts outside this rank's share)."""

    def __init__(
        self,
        dataset: Any,
        global_batch_size: int,
        collate_fn: Callable[[list[Any]], list[dict[str, Any]]] | None = None,
        shuffle: bool = True,
        seed: int = 0,
    ):
        if len(dataset) < global_batch_size:
            name = getattr(dataset, "name", None)
            raise ValueError(
                f"training_data{f' ({name})' if name else ''} has {len(dataset)} usable samples, fewer than one "
                f"global batch (train_batch_size={global_batch_size}): give more rows or a smaller train_batch_size")
        self.dataset = dataset
        self.global_batch_size = global_batch_size
        self.collate_fn = collate_fn
        self.shuffle = shuffle
        self.seed = seed
        self.steps_per_epoch = len(dataset) // global_batch_size  # the last partial batch is dropped
        self._epoch_order: tuple[int, list[int]] | None = None  # (epoch, its order): drawn once per epoch

    def epoch_order(self, epoch: int) -> list[int]:
        """The order of dataset indices in `epoch` (seeded: the same on every rank)."""
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                order = torch.randperm(len(self.dataset), generator=gen).tolist()
            else:
                order = list(range(len(self.dataset)))
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]

    def indices(self, step: int) -> list[int]:
        """Dataset indices of step `step`'s global batch (a fresh permutation every epoch)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        return self.epoch_order(epoch)[k * self.global_batch_size: (k + 1) * self.global_batch_size]

    def light_batch(self, step: int) -> list[dict[str, Any]]:
        """Step `step`'s global batch as light samples (token ids only), what the step plan reads."""
        return [self._light(i) for i in self.indices(step)]

    def _read(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        items = [self.dataset[i] for i in indices]
        return self.collate_fn(items) if self.collate_fn is not None else items

    def _light(self, index: int) -> dict[str, Any]:
        if self.collate_fn is None and hasattr(self.dataset, "light"):
            return self.dataset.light(index)
        if self.collate_fn is None and hasattr(self.dataset, "input_ids"):
            return {"input_ids": self.dataset.input_ids(index), "light": True}
        sample = self._read([index])[0]
        return {"input_ids": sample["input_ids"], "light": True}
