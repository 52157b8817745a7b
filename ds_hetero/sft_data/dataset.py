"""A conversation dataset as a map-style dataset of training samples: rows read and encoded when asked for.

    dataset = SFTDataset.from_file("train.jsonl", processor, image_folder="images/", skip_bad_rows=True)
    dataset = SFTDataset.from_dataset(hf_dataset, processor, image_folder="images/")   # datasets.Dataset
    dataset.prepare(group)   # the length index, built by every rank of `group` together (initialize calls it)
    dataset[i]               # {"input_ids", "labels", "pixel_values", ...}: one row encoded (images decoded)
    dataset.light(i)         # {"input_ids", "light": True} from the length index: no image read
    dataset.skipped          # the BadRowErrors of the rows left out

The rows come from a source read a row at a time (sources.py: a JSONL file or a folder of shards, a JSON
list, a `datasets.Dataset`). The length index (length_index.py) holds every usable row's expanded token
ids, measured from the text and the image headers without decoding a pixel, so a rank encodes only the
rows its stages handle: of every other row the step plan reads the index's ids. A row whose real encoding
differs from its index entry raises, naming the row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from .encode import encode_row
from .index_build import RowMeasure, build_index, cache_folder, skipped_errors
from .length_index import LengthIndex
from .rows import BadRowError, Row, default_image_folder
from .sources import RawRow, Undecodable, open_source

LATE_ADVICE = ("fix or remove the row: its image or video was found broken only when decoded, after the step's "
               "plan counted it, so it cannot be skipped")


class SFTDataset(Dataset):
    def __init__(self, source, processor: Any, image_folder: str | None = None, skip_bad_rows: bool = False,
                 index_dir: str | None = "auto"):
        self.source, self.processor = source, processor
        self.image_folder = default_image_folder(source) if image_folder is None else image_folder
        self.skip_bad_rows, self.index_dir = skip_bad_rows, index_dir
        self.index: LengthIndex | None = None
        self.index_folder: str | None = None  # where the index is cached (None: not cached)
        self.log = None  # where prepare() says what it did (the recipe: rank 0's print)

    @classmethod
    def from_file(cls, path: str, processor: Any, image_folder: str | None = None, skip_bad_rows: bool = False,
                  index_dir: str | None = "auto") -> "SFTDataset":
        """A JSON list, a JSONL file, or a folder of JSONL shards."""
        return cls(open_source(path), processor, image_folder, skip_bad_rows, index_dir)

    @classmethod
    def from_dataset(cls, dataset, processor: Any, image_folder: str = "", skip_bad_rows: bool = False,
                     index_dir: str | None = "auto") -> "SFTDataset":
        """A Hugging Face `datasets.Dataset` of LLaVA or messages rows: images held in an `Image()` column, or
        paths relative to `image_folder` (default "": as given)."""
        return cls(open_source(dataset), processor, image_folder, skip_bad_rows, index_dir)

    # ------------------------------------------------------------------ the length index
    def prepare(self, group=None) -> "SFTDataset":
        """Builds (or reads from its cache) the length index; collective over `group` when torch.distributed
        is initialized (every rank calls it, as `ds_hetero.initialize` and the Trainer do). Raises the first
        bad row on every rank alike unless bad rows are skipped; a set with no usable row, or fewer rows than
        a caller needs, is refused by the caller naming the source."""
        if self.index is None:
            from ..families import image_token_rule

            index = build_index(self.source, self.processor, self.image_folder, group, self.index_dir,
                                rule=image_token_rule(self.processor), log=self.log)
            bad = skipped_errors(index)
            if bad and not self.skip_bad_rows:
                raise bad[0]
            if len(index) == 0:
                raise ValueError(f"{self.source.name}: no usable rows" +
                                 (f" ({len(bad)} bad, first: {bad[0]})" if bad else ""))
            self.index = index
            self.index_folder = cache_folder(self.source, self.processor, self.image_folder, self.index_dir)
        return self

    def _index(self) -> LengthIndex:
        if self.index is None:
            self.prepare()  # one process, or a caller that did not prepare: every rank measures all rows
        return self.index

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def skipped(self) -> list[BadRowError]:
        return skipped_errors(self._index(), advice="skipped (skip_bad_rows)")

    def __len__(self) -> int:
        return len(self._index())

    def raw(self, index: int) -> RawRow:
        return self.source.raw(int(self._index().source_row[index]))

    def row(self, index: int) -> Row:
        """Usable row `index`, parsed and checked (no image read)."""
        raw = self.raw(index)
        if isinstance(raw.obj, Undecodable):
            raise BadRowError(raw.file, raw.row, raw.obj.reason, raw.line)
        return RowMeasure(self.processor, self.image_folder, None).row(raw)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.row(index)
        try:
            sample = encode_row(row, self.processor)
        except BadRowError as exc:  # found only now (an image or clip broken past its header, or changed since
            # the index): skip_bad_rows could not have left it out, so the advice never names it
            raise BadRowError(exc.file, exc.row, exc.reason, exc.line, advice=LATE_ADVICE) from None
        expected = self._index().input_ids(index)
        if not torch.equal(sample["input_ids"], expected):
            raise row.error(
                f"its encoding ({sample['input_ids'].numel()} tokens) differs from its length index entry "
                f"({expected.numel()} tokens, from the text and the image and video headers): an image or video "
                f"changed after the index was built, or the processor expands them differently from its family's "
                f"token rule; " +
                (f"delete the index folder ({self.index_folder}) to rebuild it" if self.index_folder else
                 "check the image and video files and the processor"))
        return sample

    def light(self, index: int) -> dict[str, Any]:
        """What the step plan reads of a row this rank does not encode: its expanded ids, from the index."""
        return {"input_ids": self._index().input_ids(index), "light": True}

    def input_ids(self, index: int) -> torch.Tensor:
        return self._index().input_ids(index)

    def skipped_summary(self) -> str:
        """One line for the log: how many rows were skipped and why the first one was."""
        skipped = self._index().skipped
        if not skipped:
            return ""
        first = BadRowError(**{k: skipped[0][k] for k in ("file", "row", "reason", "line")}, advice="skipped")
        return f"skipped {len(skipped)} bad row(s) of {self.source.name} (first: {first})"
