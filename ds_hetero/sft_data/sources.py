"""Where the rows of a conversation dataset come from, read one row at a time (no row held before it is asked for).

    source = open_source("train.jsonl")          # a JSONL file, a JSON list, or a folder of *.jsonl shards
    source = open_source("saved/")               # a folder written by `datasets.Dataset.save_to_disk`
    source = open_source(hf_dataset)             # a Hugging Face `datasets.Dataset` (Arrow, memory-mapped)
    len(source); source.raw(i)                   # RawRow(obj, file, row, line)

A JSONL file (or every `*.jsonl` shard of a folder, in name order) is scanned once for its line starts
(a few bytes a row, kept as a numpy array) and a row is read from its offset when asked for: a dataset
larger than memory is never loaded whole. A line that is not JSON, or not UTF-8, becomes a RawRow whose
`obj` is `Undecodable` (a bad row named by file, row and line, skippable like any other). A JSON list
has to be parsed whole (JSON has no line structure to seek in): use JSONL for sets that do not fit.

A `datasets.Dataset` is read through Arrow without decoding anything: a `datasets.Image()` column (what
TRL's vision datasets have: `images` as a list of Image, or one `image`) gives {"bytes", "path"} per image,
which becomes an EmbeddedImage (image_headers.py) when the bytes are held in the dataset, or the path
otherwise. So the length index reads only image headers, and a row's pixels are decoded when it is encoded.

`fingerprint()` is a digest of the content (the bytes of every file, or the Arrow dataset's own
fingerprint): the length index's cache key (length_index.py).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class Undecodable:
    """A row that could not be read as a JSON object (its reason is the bad row's message)."""

    reason: str


@dataclass(frozen=True)
class RawRow:
    obj: Any  # the JSON object, or Undecodable
    file: str
    row: int  # 0-based among the file's rows (a shard's own rows for a folder)
    line: int | None  # JSONL: the 1-based line


def file_digest(paths: Sequence[str]) -> str:
    """Digest of the files' bytes (read in 8 MiB blocks: a 1 GB file costs about a second)."""
    h = hashlib.blake2b(digest_size=16)
    for path in paths:
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            while block := f.read(1 << 23):
                h.update(block)
    return h.hexdigest()


def _line_starts(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(byte offset, 1-based line number) of every non-blank line of a file, scanned in blocks."""
    offsets, lines = [], []
    with open(path, "rb") as f:
        position, line, start, blank = 0, 1, 0, True
        while block := f.read(1 << 23):
            view = memoryview(block)
            at = 0
            while True:
                nl = block.find(b"\n", at)
                piece = view[at:] if nl < 0 else view[at:nl]
                if blank and bytes(piece).strip():
                    blank = False
                if nl < 0:
                    break
                if not blank:
                    offsets.append(start)
                    lines.append(line)
                line, start, blank, at = line + 1, position + nl + 1, True, nl + 1
            position += len(block)
        if not blank:
            offsets.append(start)
            lines.append(line)
    return np.asarray(offsets, dtype=np.int64), np.asarray(lines, dtype=np.int64)


def _decode_line(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Undecodable(f"not UTF-8 (byte {data[exc.start:exc.start + 1]!r} at column {exc.start + 1})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return Undecodable(f"not JSON ({exc})")


class JsonlSource:
    """One JSONL file or several shards, read a row at a time from the line offsets."""

    def __init__(self, paths: Sequence[str]):
        self.paths = [os.path.abspath(p) for p in paths]
        starts = [_line_starts(p) for p in self.paths]
        self.offsets = np.concatenate([s[0] for s in starts]) if starts else np.zeros(0, np.int64)
        self.lines = np.concatenate([s[1] for s in starts]) if starts else np.zeros(0, np.int64)
        counts = [len(s[0]) for s in starts]
        self.file_of = np.repeat(np.arange(len(self.paths), dtype=np.int32), counts)
        self.first_row = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.name = self.paths[0] if len(self.paths) == 1 else os.path.dirname(self.paths[0])

    def __len__(self) -> int:
        return len(self.offsets)

    def fingerprint(self) -> str:
        return file_digest(self.paths)

    def raw(self, i: int) -> RawRow:
        f = int(self.file_of[i])
        with open(self.paths[f], "rb") as fh:
            fh.seek(int(self.offsets[i]))
            data = fh.readline()
        return RawRow(_decode_line(data), self.paths[f], int(i - self.first_row[f]), int(self.lines[i]))

    def __getstate__(self):  # worker processes get the offsets, not open files (there are none)
        return self.__dict__


class JsonListSource:
    """A JSON list of rows (parsed whole: JSON cannot be read a row at a time), each row's line kept."""

    def __init__(self, path: str):
        self.paths = [os.path.abspath(path)]
        self.name = self.paths[0]
        with open(path, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise ValueError(f"{path}: line {line}: not UTF-8 (byte {data[exc.start:exc.start + 1]!r}); a JSON list "
                             f"is read whole, so no row of it can be skipped: fix the byte") from exc
        self.rows, self.row_lines = _json_list(text, path)

    def __len__(self) -> int:
        return len(self.rows)

    def fingerprint(self) -> str:
        return file_digest(self.paths)

    def raw(self, i: int) -> RawRow:
        return RawRow(self.rows[i], self.name, i, self.row_lines[i])


def _json_list(text: str, path: str) -> tuple[list[Any], list[int]]:
    """The elements of a JSON list and the 1-based line each starts on."""
    decoder, ws = json.JSONDecoder(), " \t\r\n"
    rows, lines = [], []
    pos, line, counted = text.index("[") + 1, 1, 0

    def line_at(p: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, p)
        counted = p
        return line

    def fail(p: int, what: str) -> ValueError:
        return ValueError(f"{path}: line {line_at(p)}: not a JSON list of rows ({what}); a JSON list is read whole, "
                          f"so no row of it can be skipped: fix the file")

    while True:
        while pos < len(text) and text[pos] in ws:
            pos += 1
        if pos < len(text) and text[pos] == "]" and not rows:
            return rows, lines
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise fail(exc.pos, exc.msg) from exc
        rows.append(obj)
        lines.append(line_at(pos))
        pos = end
        while pos < len(text) and text[pos] in ws:
            pos += 1
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos < len(text) and text[pos] == "]":
            return rows, lines
        else:
            raise fail(pos, "expected ',' or ']' after a row")


class DatasetSource:
    """A Hugging Face `datasets.Dataset` (memory-mapped Arrow: rows are read when asked for, images undecoded)."""

    def __init__(self, dataset: Any, name: str | None = None, paths: Sequence[str] = ()):
        self.dataset = dataset
        # the Arrow formatter returns the stored values: an Image column's {"bytes", "path"}, never pixels
        # (cast_column(Image(decode=False)) would rewrite a whole list-of-images column to do the same)
        self.stored = dataset.with_format("arrow")
        self.image_columns = [c for c, f in dataset.features.items() if _holds_images(f)]
        files = [f.get("filename") for f in getattr(dataset, "cache_files", []) or []]
        self.name = name or (files[0] if files and files[0] else f"datasets.Dataset({len(dataset)} rows)")
        self.paths = [os.path.abspath(p) for p in paths]  # set for a saved folder: the index goes beside it

    def __len__(self) -> int:
        return len(self.dataset)

    def fingerprint(self) -> str:
        fp = getattr(self.dataset, "_fingerprint", None)  # the content's own key (kept by save/load_from_disk)
        if not fp:
            raise ValueError(f"{self.name}: the dataset has no fingerprint to key its length index by; pass "
                             f"index_dir=None to build the index without caching it")
        return f"arrow-{fp}"

    def raw(self, i: int) -> RawRow:
        obj = self.stored[int(i)].to_pylist()[0]
        for column in self.image_columns:
            value = obj.get(column)
            if isinstance(value, list):
                obj[column] = [_stored_image(v, f"{column}[{k}]") for k, v in enumerate(value)]
            elif value is not None:
                obj[column] = _stored_image(value, column)
        return RawRow(obj, self.name, int(i), None)


def _holds_images(feature: Any) -> bool:
    """An Image feature, or a list of them (List, LargeList, Sequence, or a plain [Image()])."""
    from datasets import Image

    if isinstance(feature, list) and len(feature) == 1:
        feature = feature[0]
    return isinstance(feature, Image) or isinstance(getattr(feature, "feature", None), Image)


def _stored_image(value: Any, field: str) -> Any:
    """An Image column's stored {"bytes", "path"} -> an EmbeddedImage (bytes held) or the path (a file)."""
    from .image_headers import EmbeddedImage

    if not isinstance(value, dict):
        return value  # not an image value: parse_row names it
    data, path = value.get("bytes"), value.get("path")
    if data:
        where = f"{os.path.basename(path)}, " if path else ""
        return EmbeddedImage(data, f"{field} ({where}{len(data)} bytes in the dataset)")
    return path  # None when the image is neither held nor a file: parse_row refuses the row


def _saved_dataset(path: str) -> "DatasetSource":
    """A folder written by `Dataset.save_to_disk`, opened with `load_from_disk` (memory-mapped Arrow)."""
    import datasets

    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        splits = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
        raise ValueError(f"{path}: a DatasetDict folder; give one split's folder, e.g. "
                         + " or ".join(os.path.join(path, s) for s in splits[:3]))
    dataset = datasets.load_from_disk(path)
    files = [f["filename"] for f in dataset.cache_files] or [os.path.join(path, "state.json")]
    return DatasetSource(dataset, name=os.path.abspath(path), paths=files)


def open_source(data: Any) -> "JsonlSource | JsonListSource | DatasetSource":
    """A row source for a path (JSONL file, JSON list, folder of JSONL shards, a `save_to_disk` folder) or a
    `datasets.Dataset` (a DatasetDict is refused: pick its split)."""
    if not isinstance(data, (str, os.PathLike)):
        if hasattr(data, "features") and hasattr(data, "__getitem__"):
            return DatasetSource(data)
        if isinstance(data, dict) and data and all(hasattr(v, "features") for v in data.values()):
            raise ValueError(f"a DatasetDict (splits {', '.join(data)}): give one split, e.g. "
                             f"data[{next(iter(data))!r}]")
        raise ValueError(f"training data of type {type(data).__name__}: give a JSON / JSONL file, a folder of "
                         f"JSONL shards, a folder written by Dataset.save_to_disk, or a datasets.Dataset")
    path = os.fspath(data)
    if any(os.path.isfile(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json")):
        return _saved_dataset(path)
    if os.path.isdir(path):
        shards = sorted(glob.glob(os.path.join(path, "*.jsonl")))
        if not shards:
            raise ValueError(f"{path}: a folder with no *.jsonl shards")
        return JsonlSource(shards)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file or folder")
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head:
        raise ValueError(f"{path}: the file is empty")
    return JsonListSource(path) if head.startswith(b"[") else JsonlSource([path])
