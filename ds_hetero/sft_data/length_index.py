"""The length index: every usable row's token ids as the processor would expand them, without any pixels.

    index = LengthIndex.load(folder)        # memory-mapped: a rank keeps only the pages it reads
    index.input_ids(i)                      # usable row i's expanded input_ids (image runs included)
    index.source_row[i]                     # where usable row i sits in the source

The step plan reads only `input_ids` of the samples a rank does not encode (their length, where each
image's placeholder run sits and how long it is: packing, encoder balance, the boundary). The index
gives exactly those ids for every row from the text and the image headers (index_build.py), so no rank
decodes an image it does not encode.

Storage is run-length: `tokens[k]` repeated `repeats[k]` times, row i's runs between `run_start[i]`
and `run_start[i + 1]`. An image's placeholder run is one entry, so the files are about the size of
the text's tokens (int32 each), whatever the images' token counts. Files, in a folder per
(data content, processor, image folder): tokens.npy, repeats.npy, run_start.npy, source_row.npy
(numpy's own format, opened with mmap_mode="r") and meta.json (the rows left out, with their reasons).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

ARRAYS = ("tokens", "repeats", "run_start", "source_row")
FORMAT = 2  # bump when the files change meaning (2: rows with videos measured, no longer left out)


def run_length(ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(values, counts) of the runs of equal consecutive ids."""
    a = np.asarray(ids, dtype=np.int64)
    if a.size == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    starts = np.flatnonzero(np.concatenate([[True], a[1:] != a[:-1]]))
    counts = np.diff(np.concatenate([starts, [a.size]]))
    return a[starts].astype(np.int32), counts.astype(np.int32)


# a part of the index as one rank measures it (index_build.py): flat arrays, gathered without pickling
PART_DTYPES = {"tokens": np.int32, "repeats": np.int32, "runs": np.int64, "source_row": np.int64}


class RunsBuilder:
    """Rows' runs appended one at a time, held as flat arrays.

    A row's two small arrays cost ~900 bytes of Python and numpy headers beside ~500 of data (a million
    rows: ~1 GB); pending rows are joined into flat chunks every `flush_rows` rows instead."""

    def __init__(self, flush_rows: int = 4096):
        self.flush_rows = flush_rows
        self.pending: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.chunks: dict[str, list[np.ndarray]] = {name: [] for name in PART_DTYPES}

    def add(self, source_row: int, tokens: np.ndarray, repeats: np.ndarray) -> None:
        self.pending.append((source_row, tokens, repeats))
        if len(self.pending) >= self.flush_rows:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        rows, tokens, repeats = zip(*self.pending)
        for name, values in (("tokens", np.concatenate(tokens)), ("repeats", np.concatenate(repeats)),
                             ("runs", [len(t) for t in tokens]), ("source_row", rows)):
            self.chunks[name].append(np.asarray(values, dtype=PART_DTYPES[name]))
        self.pending = []

    def arrays(self) -> dict[str, np.ndarray]:
        """{"tokens", "repeats", "runs" (runs per row), "source_row"}: the rows added, in order."""
        self._flush()
        out = {}
        for name, chunks in self.chunks.items():  # each name's chunks freed once joined
            out[name] = np.concatenate(chunks) if chunks else np.zeros(0, PART_DTYPES[name])
            self.chunks[name] = []
        return out


@dataclass
class LengthIndex:
    tokens: np.ndarray  # int32, run values
    repeats: np.ndarray  # int32, run lengths
    run_start: np.ndarray  # int64, usable rows + 1
    source_row: np.ndarray  # int64, usable row -> source row
    skipped: list[dict] = field(default_factory=list)  # bad rows: {"file", "row", "line", "reason"}
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.source_row)

    def input_ids(self, i: int) -> torch.Tensor:
        a, b = int(self.run_start[i]), int(self.run_start[i + 1])
        return torch.from_numpy(np.repeat(self.tokens[a:b].astype(np.int64), self.repeats[a:b]))

    def length(self, i: int) -> int:
        a, b = int(self.run_start[i]), int(self.run_start[i + 1])
        return int(self.repeats[a:b].sum())

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[int, np.ndarray, np.ndarray]], skipped: list[dict],
                  meta: dict) -> "LengthIndex":
        """From (source row, run values, run counts) of every usable row, in source order."""
        part = RunsBuilder()
        for source_row, tokens, repeats in rows:
            part.add(source_row, tokens, repeats)
        return cls.from_parts([part.arrays()], skipped, meta)

    @classmethod
    def from_parts(cls, parts: Sequence[dict[str, np.ndarray]], skipped: list[dict], meta: dict) -> "LengthIndex":
        """From consecutive parts' RunsBuilder.arrays(), in source order."""
        def cat(name: str) -> np.ndarray:  # one part (what build_index gives) is taken as it is, not copied
            joined = parts[0][name] if len(parts) == 1 else np.concatenate([p[name] for p in parts])
            return joined.astype(PART_DTYPES[name], copy=False)

        runs = cat("runs")
        run_start = np.zeros(len(runs) + 1, np.int64)
        np.cumsum(runs, out=run_start[1:])
        return cls(cat("tokens"), cat("repeats"), run_start, cat("source_row"), skipped, meta)

    # ------------------------------------------------------------------ the cache folder
    def save(self, folder: str) -> None:
        """Written to a temporary sibling, then renamed: a reader sees a whole index or none."""
        parent = os.path.dirname(os.path.abspath(folder))
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".partial-", dir=parent)
        try:
            for name in ARRAYS:
                np.save(os.path.join(tmp, f"{name}.npy"), getattr(self, name))
            with open(os.path.join(tmp, "meta.json"), "w") as f:
                json.dump({**self.meta, "format": FORMAT, "skipped": self.skipped}, f)
            try:
                os.rename(tmp, folder)
            except OSError:  # another rank wrote the same index first
                if not os.path.isdir(folder):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, folder: str) -> "LengthIndex | None":
        """The index in `folder`, memory-mapped; None when there is none (or of another format)."""
        try:
            with open(os.path.join(folder, "meta.json")) as f:
                meta = json.load(f)
            if meta.get("format") != FORMAT:
                return None
            arrays = {name: np.load(os.path.join(folder, f"{name}.npy"), mmap_mode="r") for name in ARRAYS}
        except (OSError, ValueError):
            return None
        skipped = meta.pop("skipped", [])
        return cls(**arrays, skipped=skipped, meta=meta)
