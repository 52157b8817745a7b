"""Building the length index (length_index.py): every row checked and measured once, by all ranks together.

    index = build_index(source, processor, image_folder, group)   # collective over `group` (None: this process)

Per row, without decoding an image: the row is parsed and checked (rows.py), each image's header gives
its size and the cheap integrity checks (image_headers.py), the family's resize rule gives its token
count (families/<family>/media_tokens.py), and the tokenizer runs on the rendered conversation with each
placeholder expanded to that count, exactly as the processor expands it. A processor with no known rule,
or whose expansion the first image row of a part shows to differ, is measured by encoding the row
instead (slow, but once: the index is cached).

Every rank measures a contiguous 1/world of the rows, then one `all_gather_object` over `group` gives
every rank all parts, so every rank sees the same index and the same bad rows (a bad row raises the same
error everywhere, before any step). The first rank writes the cache folder (beside the data, keyed by
the content of the data, the processor and the image folder); every rank then reads it memory-mapped
(a rank that cannot see it, on a node-local disk, writes its own copy). A later run finds the folder
and reads it without measuring anything.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from typing import Any, Callable

import numpy as np
import torch.distributed as dist

from .encode import _render, encode_row
from .image_headers import image_size
from .length_index import FORMAT, LengthIndex, run_length
from .rows import BadRowError, Row, parse_row
from .sources import Undecodable

INDEX_DIR_NAME = ".ds_hetero_index"


def processor_fingerprint(processor) -> str:
    """A digest of what decides the expanded ids: the tokenizer's vocabulary and rules, the chat template
    and the processor's settings (its image processor's resize options among them)."""
    h = hashlib.blake2b(digest_size=16)
    tokenizer = getattr(processor, "tokenizer", processor)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    h.update((backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))).encode())
    h.update(str(getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", "")).encode())
    try:
        settings = processor.to_json_string()
    except (TypeError, ValueError, AttributeError):
        settings = repr(getattr(processor, "image_processor", None))
    h.update(settings.encode())
    h.update(type(processor).__name__.encode())
    return h.hexdigest()


def cache_folder(source, processor, image_folder: str, index_dir: str | None) -> str | None:
    """The index's folder: under `index_dir`, or beside the data (`.ds_hetero_index/`); None: not cached."""
    if index_dir is None:
        return None
    key = hashlib.blake2b(digest_size=12)
    for part in (str(FORMAT), source.fingerprint(), processor_fingerprint(processor), os.path.abspath(image_folder)):
        key.update(part.encode())
    if index_dir == "auto":
        base = os.path.dirname(source.paths[0]) if getattr(source, "paths", None) else None
        index_dir = os.path.join(base, INDEX_DIR_NAME) if base and os.access(base, os.W_OK) else \
            os.path.join(os.path.expanduser("~"), ".cache", "ds_hetero", "index")
    stem = os.path.basename(source.name.rstrip("/")) or "data"
    return os.path.join(index_dir, f"{stem}.{key.hexdigest()}")


class RowMeasure:
    """One row -> its run-length expanded ids, or BadRowError."""

    def __init__(self, processor, image_folder: str, rule: Callable[[int, int], int] | None):
        self.processor, self.image_folder, self.rule = processor, image_folder, rule
        self.token = getattr(processor, "image_token", None)
        self.verified = rule is None  # the rule is checked against one real encoding per part

    def row(self, raw) -> Row:
        if isinstance(raw.obj, Undecodable):
            raise BadRowError(raw.file, raw.row, raw.obj.reason, raw.line)
        return parse_row(raw.obj, raw.file, raw.row, self.image_folder, raw.line)

    def __call__(self, raw) -> tuple[np.ndarray, np.ndarray]:
        row = self.row(raw)
        sizes = []
        for path in row.images:
            try:
                sizes.append(image_size(path))
            except ValueError as exc:
                raise row.error(str(exc)) from exc
        ids = self._from_sizes(row, sizes) if self.rule is not None else None
        if ids is None or not self.verified:
            real = encode_row(row, self.processor)["input_ids"].tolist()
            if ids is not None and row.images:
                self.verified = True
                if ids != real:  # the processor expands differently: measure every row by encoding it
                    self.rule = None
            ids = real
        return run_length(ids)

    def _from_sizes(self, row: Row, sizes: list[tuple[int, int]]) -> list[int] | None:
        text = _render(self.processor, row.messages())
        if sizes and (self.token is None or text.count(self.token) != len(sizes)):
            return None
        counts = iter([self.rule(h, w) for h, w in sizes])
        if sizes:
            text = re.sub(re.escape(self.token), lambda _: self.token * next(counts), text)
        return self.processor.tokenizer(text, add_special_tokens=False)["input_ids"]


def _measure(source, measure: RowMeasure, rows: range) -> tuple[list, list[dict]]:
    entries, bad = [], []
    for i in rows:
        try:
            tokens, repeats = measure(source.raw(i))
            entries.append((i, tokens, repeats))
        except BadRowError as exc:
            bad.append({**exc.as_dict(), "source_row": i})
    return entries, bad


def build_index(source, processor, image_folder: str, group=None, index_dir: str | None = "auto",
                rule: Callable[[int, int], int] | None = None, log: Callable[[str], None] | None = None
                ) -> LengthIndex:
    """The length index of `source` (cached in `index_dir`: "auto" beside the data, None: not cached).

    Collective over `group` when torch.distributed is initialized (every rank of it must call this, in
    the same order); `rule`: (height, width) -> image tokens (families.image_token_rule)."""
    distributed = dist.is_available() and dist.is_initialized()
    size, me = (dist.get_world_size(group), dist.get_rank(group)) if distributed else (1, 0)
    folder = cache_folder(source, processor, image_folder, index_dir)
    index = LengthIndex.load(folder) if folder else None
    if distributed:  # every rank the same decision: all read the cache, or all measure
        found: list[Any] = [None] * size
        dist.all_gather_object(found, index is not None, group=group)
        if not all(found):
            index = None
    if index is not None:
        return index
    start = time.perf_counter()
    n = len(source)
    mine = range(me * n // size, (me + 1) * n // size)
    part = _measure(source, RowMeasure(processor, image_folder, rule), mine)
    parts: list[Any] = [part]
    if distributed:
        parts = [None] * size
        dist.all_gather_object(parts, part, group=group)
    entries = [e for p in parts for e in p[0]]
    skipped = [b for p in parts for b in p[1]]
    meta = {"source": source.name, "rows": n, "seconds": round(time.perf_counter() - start, 3), "ranks": size}
    index = LengthIndex.from_rows(entries, skipped, meta)
    if log is not None:
        log(f"data: length index of {source.name}: {len(index)} rows measured in {meta['seconds']} s by {size} "
            f"rank(s)" + (f", cached in {folder}" if folder else ""))
    if folder is None:
        return index
    if me == 0:
        index.save(folder)
    if distributed:
        dist.barrier(group=group)
    if not os.path.isdir(folder):  # this rank's disk is not rank 0's
        index.save(folder)
    return LengthIndex.load(folder) or index


def skipped_errors(index: LengthIndex, advice: str | None = None) -> list[BadRowError]:
    """The index's bad rows as errors (in source order)."""
    kw = {} if advice is None else {"advice": advice}
    return [BadRowError(b["file"], b["row"], b["reason"], b["line"], **kw) for b in index.skipped]

