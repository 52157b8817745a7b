"""A video file read with PyAV: its header without decoding a frame (the length index), and its sampled frames.

    header = clip_header("clip.mp4")          # ClipHeader(frames, fps, height, width); ValueError saying what is wrong
    frames = decode_frames("clip.mp4", [0, 4, 8, 12])   # uint8 RGB [4, H, W, 3]

The header is what transformers' PyAV reader takes its metadata from: the first video stream's frame count,
average frame rate, height and width. The file's packets are demuxed too (read, not decoded), so the common
ways a clip is broken are found before any step, where `skip_bad_rows` can leave its row out: a container
that does not open, no video stream, no frames, or fewer packets than the header counts (a truncated copy).
A container that stores no frame count (Matroska, WebM) is counted by its packets. A clip broken only past
that (a packet that does not decode) is found when it is decoded, in its step.

PyAV (`pip install av`, the `video` extra) is imported only when a row has videos.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class ClipHeader:
    frames: int
    fps: float | None  # None: the stream has no frame rate
    height: int
    width: int


def _av():
    try:
        import av
    except ImportError as exc:
        raise ValueError("video files need PyAV: pip install av (or ds_hetero[video])") from exc
    return av


def clip_header(path: str) -> ClipHeader:
    """The clip's frame count, frame rate and size, from its header and its packets (no frame decoded)."""
    av = _av()
    try:
        with av.open(path) as container:
            if not container.streams.video:
                raise ValueError(f"video {path} has no video stream")
            stream = container.streams.video[0]
            frames, rate = int(stream.frames or 0), stream.average_rate
            height, width = int(stream.height or 0), int(stream.width or 0)
            packets = sum(1 for packet in container.demux(stream) if packet.size)
    except (av.error.FFmpegError, OSError) as exc:
        raise ValueError(f"video {path} cannot be read ({exc})") from exc
    if frames and packets < frames:
        raise ValueError(f"video {path} is truncated (its header counts {frames} frames, it holds {packets})")
    frames = frames or packets
    if frames <= 0:
        raise ValueError(f"video {path} has no frames")
    if height <= 0 or width <= 0:
        raise ValueError(f"video {path} has size {width}x{height}")
    return ClipHeader(frames, float(rate) if rate else None, height, width)


def decode_frames(path: str, indices: Sequence[int]) -> np.ndarray:
    """The frames at `indices` (ascending, distinct) as uint8 RGB [len(indices), H, W, 3], decoded in order
    and stopped after the last one wanted (as transformers' PyAV reader does)."""
    av = _av()
    wanted, last, kept = set(int(i) for i in indices), max(indices), []
    try:
        with av.open(path) as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i > last:
                    break
                if i in wanted:
                    kept.append(frame.to_ndarray(format="rgb24"))
    except (av.error.FFmpegError, OSError) as exc:
        raise ValueError(f"video {path} cannot be decoded ({exc})") from exc
    if len(kept) != len(wanted):
        raise ValueError(f"video {path} decodes to fewer frames than its header counts (frame {last} of "
                         f"{len(wanted)} sampled is missing)")
    return np.stack(kept)
