"""The rows of a conversation file as a map-style dataset of training samples (encoded when read).

    dataset = SFTDataset.from_file("train.jsonl", processor, image_folder="images/", skip_bad_rows=True)
    dataset[0]            # {"input_ids", "labels", "pixel_values", ...}: what ds_hetero.initialize trains on
    dataset.skipped       # the BadRowErrors of the rows left out

Every rank builds the same dataset, so a bad row raises on every rank before any collective.
Each rank encodes only the samples its stages handle (the loader asks `input_ids(i)` for the rest,
kept once computed: a list of ints per row, so the image token counts of later epochs cost nothing).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.utils.data import Dataset

from .encode import encode_row
from .rows import BadRowError, Row, read_rows


class SFTDataset(Dataset):
    def __init__(self, rows: Sequence[Row], processor: Any, skipped: Sequence[BadRowError] = ()):
        self.rows, self.processor, self.skipped = list(rows), processor, list(skipped)
        self._ids: dict[int, torch.Tensor] = {}  # token ids of rows encoded once (the loader's light samples)

    @classmethod
    def from_file(cls, path: str, processor: Any, image_folder: str | None = None,
                  skip_bad_rows: bool = False) -> "SFTDataset":
        rows, skipped = read_rows(path, image_folder, skip_bad_rows)
        return cls(rows, processor, skipped)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = encode_row(self.rows[index], self.processor)
        self._ids[index] = sample["input_ids"]
        return sample

    def input_ids(self, index: int) -> torch.Tensor:
        if index not in self._ids:
            self[index]
        return self._ids[index]

    def skipped_summary(self) -> str:
        """One line for the log: how many rows were skipped and why the first one was."""
        if not self.skipped:
            return ""
        return f"skipped {len(self.skipped)} bad row(s) of {self.skipped[0].file} (first: {self.skipped[0]})"
