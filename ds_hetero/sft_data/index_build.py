"""Building the length index (length_index.py): every row checked and measured once, by all ranks together.

    index = build_index(source, processor, image_folder, group)   # collective over `group` (None: this process)

Per row, without decoding an image or a frame: the row is parsed and checked (rows.py), each image's header
gives its size and the cheap integrity checks (image_headers.py), the family's resize rule gives its token
count (families/<family>/media_tokens.py); each video's header and packets give its frame count, frame rate
and size (video_files.py), the family's video rule its kept frames and grid, the processor its placeholder
text (clips.py); the tokenizer runs on the rendered conversation with each placeholder expanded, exactly as
the processor expands it. A processor with no known rule, or whose expansion the first image row (and the
first video row) of a part shows to differ, is measured by encoding the row instead (slow, but once: the
index is cached).

Every rank measures a contiguous 1/world of the rows into flat arrays (length_index.RunsBuilder), then
an all_gather of those arrays' bytes over `group` (in bounded chunks, _gather_parts) gives every rank all
parts, so every rank sees the same index and the same bad rows (a bad row raises the same
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
import torch
import torch.distributed as dist

from .clips import clip_texts, measure_clips
from .encode import _render, encode_row
from .image_headers import EmbeddedImage, image_size
from .length_index import FORMAT, PART_DTYPES, LengthIndex, RunsBuilder, run_length
from .rows import IMAGE_MARKER, BadRowError, Row, _turns, parse_row, row_videos
from .sources import Undecodable

INDEX_DIR_NAME = ".ds_hetero_index"


def processor_fingerprint(processor) -> str:
    """A digest of what decides the expanded ids: the tokenizer's vocabulary and rules, the chat template
    and the processor's settings (its image processor's resize options, its video rule's settings)."""
    from ..families import video_settings_of

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
    h.update(repr(video_settings_of(processor)).encode())
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
        self.video_token = getattr(processor, "video_token", None)
        # the rule is checked against one real encoding per part, for images and for videos
        self.verified = {"images": rule is None, "videos": rule is None}

    def row(self, raw) -> Row:
        if isinstance(raw.obj, Undecodable):
            raise BadRowError(raw.file, raw.row, raw.obj.reason, raw.line)
        if _holds_images(raw.obj):
            return _row_with_held_images(raw, self.image_folder)
        return parse_row(raw.obj, raw.file, raw.row, self.image_folder, raw.line)

    def __call__(self, raw) -> tuple[np.ndarray, np.ndarray]:
        row = self.row(raw)
        sizes = []
        for path in row.images:
            try:
                sizes.append(image_size(path))
            except ValueError as exc:
                raise row.error(str(exc)) from exc
        clips = measure_clips(row, self.processor) if row.videos else []
        ids = self._from_sizes(row, sizes, clips) if self.rule is not None else None
        unchecked = [kind for kind in ("images", "videos") if getattr(row, kind) and not self.verified[kind]]
        if ids is None or unchecked:
            real = encode_row(row, self.processor)["input_ids"].tolist()
            if ids is not None:
                self.verified.update({kind: True for kind in unchecked})
                if ids != real:  # the processor expands differently: measure every row by encoding it
                    self.rule = None
            ids = real
        return run_length(ids)

    def _from_sizes(self, row: Row, sizes: list[tuple[int, int]], clips: list) -> list[int] | None:
        text = _render(self.processor, row.messages())
        if sizes and (self.token is None or text.count(self.token) != len(sizes)):
            return None
        if clips and (self.video_token is None or text.count(self.video_token) != len(clips)):
            return None
        expanded = {self.token: iter([self.token * self.rule(h, w) for h, w in sizes]),
                    self.video_token: iter(clip_texts(self.processor, clips) if clips else [])}
        tokens = [t for t, n in ((self.token, sizes), (self.video_token, clips)) if n]
        if tokens:  # one pass, so a clip's text (which may hold other placeholders' markers) is never rescanned
            pattern = "|".join(re.escape(t) for t in tokens)
            text = re.sub(pattern, lambda m: next(expanded[m.group(0)]), text)
        return self.processor.tokenizer(text, add_special_tokens=False)["input_ids"]


def _images_value(obj: Any) -> Any:
    return obj.get("images", obj.get("image")) if isinstance(obj, dict) else None


def _holds_images(obj: Any) -> bool:
    images = _images_value(obj)
    return isinstance(images, EmbeddedImage) or isinstance(images, list) and \
        any(isinstance(im, EmbeddedImage) for im in images)


def _row_with_held_images(raw, image_folder: str) -> Row:
    """rows.parse_row for a row whose images are (some of them) bytes held in the data (a datasets Image
    column, sources.py): the same checks, with a held image standing for an existing file."""
    def fail(reason: str) -> BadRowError:
        return BadRowError(raw.file, raw.row, reason, raw.line)

    turns, _ = _turns(raw.obj, fail)
    value = _images_value(raw.obj)
    images = value if isinstance(value, list) else [value]
    markers = sum(kind == "image" for t in turns for kind, _ in t.parts)
    if markers != len(images):
        raise fail(f"{markers} image placeholder(s) ({IMAGE_MARKER} or {{'type': 'image'}}) but {len(images)} "
                   f"image(s) in the row: each image needs exactly one placeholder")
    resolved: list[Any] = []
    for k, image in enumerate(images):
        if isinstance(image, str):
            image = image if os.path.isabs(image) else os.path.join(image_folder, image)
            if not os.path.isfile(image):
                raise fail(f"image {image} does not exist (paths are relative to the image folder {image_folder})")
        elif not isinstance(image, EmbeddedImage):
            raise fail(f"image {k} is neither bytes held in the dataset nor a path (got {image!r})")
        resolved.append(image)
    return Row(raw.file, raw.row, tuple(turns), tuple(resolved), raw.line,
               row_videos(raw.obj, turns, image_folder, fail))


def _measure(source, measure: RowMeasure, rows: range) -> tuple[dict[str, np.ndarray], list[dict]]:
    part, bad = RunsBuilder(), []
    for i in rows:
        try:
            tokens, repeats = measure(source.raw(i))
            part.add(i, tokens, repeats)
        except BadRowError as exc:
            bad.append({**exc.as_dict(), "source_row": i})
    return part.arrays(), bad


GATHER_CHUNK = 1 << 23  # bytes a rank sends per all_gather call: the buffers are (1 + ranks) times this


def _collective_device(group) -> torch.device:
    """Where `group`'s backend takes tensors (gloo: the CPU; NCCL and the like: this rank's accelerator)."""
    if dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    return torch.device(torch.accelerator.current_accelerator().type, torch.accelerator.current_device_index())


def _gather_parts(part: dict[str, np.ndarray], bad: list[dict], group, size: int
                  ) -> tuple[dict[str, np.ndarray], list[dict]]:
    """All ranks' parts joined in rank order (= source order), and all bad rows, on every rank.

    The arrays go by all_gather of their bytes, GATHER_CHUNK at a time, straight into the joined arrays:
    all_gather_object of a million rows' part held it five times over (the pickle, its tensor, the
    gather's output, its bytes and the unpickled copy, on every rank). Only the sizes and the bad rows
    (small) are pickled."""
    sizes: list[Any] = [None] * size
    dist.all_gather_object(sizes, ({name: len(a) for name, a in part.items()}, bad), group=group)
    device = _collective_device(group)
    joined = {}
    for name, dtype in PART_DTYPES.items():
        mine = np.ascontiguousarray(part.pop(name), dtype=dtype).view(np.uint8)
        nbytes = [counts[name] * np.dtype(dtype).itemsize for counts, _ in sizes]
        starts = np.concatenate([[0], np.cumsum(nbytes)]).astype(np.int64)
        into = np.empty(int(starts[-1]), np.uint8)
        for at in range(0, max(nbytes), GATHER_CHUNK):
            span = min(GATHER_CHUNK, max(nbytes) - at)
            send = torch.zeros(span, dtype=torch.uint8)
            piece = mine[at:at + span]
            send[:len(piece)] = torch.from_numpy(piece)
            received = [torch.empty(span, dtype=torch.uint8, device=device) for _ in range(size)]
            dist.all_gather(received, send.to(device), group=group)
            for r, buffer in enumerate(received):
                n = min(span, max(0, nbytes[r] - at))
                into[starts[r] + at:starts[r] + at + n] = buffer[:n].cpu().numpy()
        del mine
        joined[name] = into.view(dtype)
    return joined, [b for _, rank_bad in sizes for b in rank_bad]


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
    part, skipped = _measure(source, RowMeasure(processor, image_folder, rule), mine)
    if size > 1:
        part, skipped = _gather_parts(part, skipped, group, size)
    meta = {"source": source.name, "rows": n, "seconds": round(time.perf_counter() - start, 3), "ranks": size}
    index = LengthIndex.from_parts([part], skipped, meta)
    del part
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

