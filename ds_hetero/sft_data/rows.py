"""Conversation files as people have them, read into checked rows (pure: no processor, no images decoded).

Two formats, one row per JSON object, in a JSON list or a JSONL file (one object per line):

    LLaVA      {"id": ..., "image": "a.png" | ["a.png", "b.png"],
                "conversations": [{"from": "human", "value": "<image>\\nwhat is here ?"},
                                  {"from": "gpt", "value": "a red circle"}]}
    messages   {"messages": [{"role": "user", "content": "<image>what is here ?"},      (LLaMA-Factory)
                             {"role": "assistant", "content": "a red circle"}],
                "images": ["a.png"]}
               content may also be TRL's list of parts: [{"type": "image"}, {"type": "text", "text": ...}]
    videos     either format with "videos": ["clip.mp4", ...] and `<video>` markers or {"type": "video"} parts
               (read for the Qwen-VL families' processors: docs/video.md)

`<image>` in a string marks where an image goes; the k-th marker of a row is its k-th image (`<video>` and
its videos alike). Image and video paths are relative to `image_folder` (default: the data file's folder).
A bad row (no conversation, an unknown role, an empty assistant turn, no assistant turn, markers not
matching the images or videos, a file missing) raises BadRowError naming the file and the row, or, with
skip_bad_rows, is left out and reported in the skipped list, so a caller can print the count.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

IMAGE_MARKER = "<image>"
VIDEO_MARKER = "<video>"
MARKERS = {IMAGE_MARKER: "image", VIDEO_MARKER: "video"}
# role spellings of both formats -> the chat-template roles
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


SKIP_ADVICE = "fix the row, or skip bad rows (skip_bad_rows=True, the recipe's --skip-bad-rows)"


class BadRowError(ValueError):
    """A row of a data file that cannot be trained on; the message names the file, the row and the fix.

    `advice` is the fix: by default fixing or skipping the row; a caller that already skips bad rows (or
    finds the row too late to skip it) says what else to do, never the option already given."""

    def __init__(self, file: str, row: int, reason: str, line: int | None = None, advice: str = SKIP_ADVICE):
        self.file, self.row, self.reason, self.line, self.advice = file, row, reason, line, advice
        where = f"row {row}" + (f" (line {line})" if line is not None else "")
        super().__init__(f"{file}: {where}: {reason}; {advice}")

    def __reduce__(self):  # raised in a data worker process, re-raised in the trainer's: pickled whole
        return (BadRowError, (self.file, self.row, self.reason, self.line, self.advice))

    def as_dict(self) -> dict:
        return {"file": self.file, "row": self.row, "reason": self.reason, "line": self.line}


@dataclass(frozen=True)
class Turn:
    role: str  # user, assistant or system
    parts: tuple[tuple[str, str], ...]  # ("text", words), ("image", "") or ("video", "")

    def message(self) -> dict[str, Any]:
        """The turn as a chat template takes it (a list of typed parts, as TRL and the HF processors do)."""
        return {"role": self.role, "content": [{"type": "text", "text": t} if kind == "text" else {"type": kind}
                                               for kind, t in self.parts]}


@dataclass(frozen=True)
class Row:
    file: str
    index: int  # 0-based position among the file's rows
    turns: tuple[Turn, ...]
    images: tuple[str, ...]  # resolved paths, in marker order
    line: int | None = None  # JSONL: the 1-based line
    videos: tuple[str, ...] = ()  # resolved paths of the video files, in marker order

    def messages(self) -> list[dict[str, Any]]:
        return [t.message() for t in self.turns]

    def error(self, reason: str) -> BadRowError:
        return BadRowError(self.file, self.index, reason, self.line)


def _split_markers(text: str) -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = []
    for piece in re.split(f"({re.escape(IMAGE_MARKER)}|{re.escape(VIDEO_MARKER)})", text):
        if piece in MARKERS:
            parts.append((MARKERS[piece], ""))
        elif piece.strip():
            parts.append(("text", piece.strip()))
    return parts


def _content_parts(content: Any, fail) -> list[tuple[str, str]]:
    if content is None:
        return []
    if isinstance(content, str):
        return _split_markers(content)
    if not isinstance(content, list):
        raise fail(f"content is a {type(content).__name__}, expected a string or a list of parts")
    parts: list[tuple[str, str]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("image", "video"):
            parts.append((kind, ""))
        elif kind == "text":
            parts.extend(_split_markers(str(part.get("text", ""))))
        else:
            raise fail(f"content part {part!r} is not {{'type': 'image'}}, {{'type': 'video'}} or "
                       "{'type': 'text', 'text': ...}")
    return parts


def _turns(obj: dict, fail) -> tuple[list[Turn], str]:
    if "conversations" in obj:
        raw, role_key, content_key, fmt = obj["conversations"], "from", "value", "LLaVA"
    elif "messages" in obj:
        raw, role_key, content_key, fmt = obj["messages"], "role", "content", "messages"
    else:
        raise fail(f"no 'conversations' (LLaVA format) or 'messages' key (keys: {', '.join(sorted(obj)) or 'none'})")
    if not isinstance(raw, list) or not raw:
        raise fail(f"'{'conversations' if fmt == 'LLaVA' else 'messages'}' must be a non-empty list of turns")
    turns = []
    for k, turn in enumerate(raw):
        if not isinstance(turn, dict) or role_key not in turn:
            raise fail(f"turn {k} has no '{role_key}' ({fmt} format: {{'{role_key}': ..., '{content_key}': ...}})")
        role = turn[role_key]
        if role not in ROLES:
            raise fail(f"turn {k} has unknown role {role!r} (known: {', '.join(ROLES)})")
        parts = _content_parts(turn.get(content_key), fail)
        if ROLES[role] == "assistant" and not any(kind == "text" for kind, _ in parts):
            raise fail(f"turn {k} is an empty assistant turn (nothing to learn)")
        turns.append(Turn(ROLES[role], tuple(parts)))
    if not any(t.role == "assistant" for t in turns):
        raise fail("no assistant turn (labels are taken on assistant turns only: nothing to learn)")
    return turns, fmt


def _images(obj: dict, fmt: str, fail) -> list[str]:
    key = "image" if fmt == "LLaVA" else "images"
    images = obj.get(key, obj.get("images" if key == "image" else "image"))
    if images is None:
        return []
    images = [images] if isinstance(images, str) else images
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        raise fail(f"'{key}' must be a path or a list of paths, got {images!r}")
    return images


def row_videos(obj: dict, turns: list[Turn], image_folder: str, fail) -> tuple[str, ...]:
    """The row's video files ("videos", or "video" as LLaVA's "image"), resolved and checked against the
    `<video>` / {'type': 'video'} placeholders."""
    videos = obj.get("videos", obj.get("video"))
    videos = [] if videos is None else [videos] if isinstance(videos, str) else videos
    if not isinstance(videos, list) or not all(isinstance(p, str) for p in videos):
        raise fail(f"'videos' must be a path or a list of paths, got {videos!r}")
    markers = sum(kind == "video" for t in turns for kind, _ in t.parts)
    if markers != len(videos):
        raise fail(f"{markers} video placeholder(s) ({VIDEO_MARKER} or {{'type': 'video'}}) but {len(videos)} "
                   f"video(s) listed: each video needs exactly one placeholder")
    paths = tuple(p if os.path.isabs(p) else os.path.join(image_folder, p) for p in videos)
    for p in paths:
        if not os.path.isfile(p):
            raise fail(f"video {p} does not exist (paths are relative to the image folder {image_folder})")
    return paths


def parse_row(obj: Any, file: str, index: int, image_folder: str, line: int | None = None) -> Row:
    """One JSON object -> a checked Row (BadRowError naming file and row if it cannot be trained on)."""
    def fail(reason: str) -> BadRowError:
        return BadRowError(file, index, reason, line)

    if not isinstance(obj, dict):
        raise fail(f"is a {type(obj).__name__}, not an object")
    turns, fmt = _turns(obj, fail)
    images = _images(obj, fmt, fail)
    markers = sum(kind == "image" for t in turns for kind, _ in t.parts)
    if markers != len(images):
        raise fail(f"{markers} image placeholder(s) ({IMAGE_MARKER} or {{'type': 'image'}}) but {len(images)} "
                   f"image(s) listed: each image needs exactly one placeholder")
    paths = [p if os.path.isabs(p) else os.path.join(image_folder, p) for p in images]
    for p in paths:
        if not os.path.isfile(p):
            raise fail(f"image {p} does not exist (paths are relative to the image folder {image_folder})")
    return Row(file, index, tuple(turns), tuple(paths), line, row_videos(obj, turns, image_folder, fail))


def read_rows(path: str, image_folder: str | None = None, skip_bad_rows: bool = False
              ) -> tuple[list[Row], list[BadRowError]]:
    """(rows, skipped) of a LLaVA / messages file, every row parsed (the whole file in memory: the dataset
    reads a row at a time instead, sft_data/dataset.py); with skip_bad_rows=False the first bad row raises."""
    from .sources import Undecodable, open_source

    source = open_source(path)
    folder = default_image_folder(source) if image_folder is None else image_folder
    rows, skipped = [], []
    for index in range(len(source)):
        raw = source.raw(index)
        try:
            if isinstance(raw.obj, Undecodable):
                raise BadRowError(raw.file, raw.row, raw.obj.reason, raw.line)
            rows.append(parse_row(raw.obj, raw.file, raw.row, folder, raw.line))
        except BadRowError as exc:
            if not skip_bad_rows:
                raise
            skipped.append(exc)
    if not rows:
        raise ValueError(f"{path}: no usable rows" + (f" ({len(skipped)} bad, first: {skipped[0]})" if skipped else ""))
    return rows, skipped


def default_image_folder(source) -> str:
    """Image paths are relative to the data file's folder (a folder of shards: that folder) unless given."""
    paths = getattr(source, "paths", None)
    if not paths:
        raise ValueError(f"{source.name}: give image_folder (the folder its rows' image paths are relative to)")
    return os.path.dirname(paths[0])
