"""A row's video clips: measured from their headers (the length index) or decoded (the row's encoding).

    clips = measure_clips(row, processor)          # [(video_grid_thw [t, h, w], metadata)], no frame decoded
    texts = clip_texts(processor, clips)           # each clip's placeholder text, as the processor writes it
    frames, settings, metadata = load_clips(row, processor)   # the sampled frames, decoded
    processor = with_clips(processor, settings, metadata)     # the processor, its video processor ours

Both go through the same sampling and resize rule (families/qwen2_vl/video_frames.py) with the same header
(video_files.py), so a clip's tokens in the index are the tokens its encoding gives. A processor no family
reads videos for, and a clip that cannot be read or sampled, make the row a bad row naming the file.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from .rows import Row
from .video_files import clip_header, decode_frames

VIDEO_FAMILIES = "Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5"


def video_settings_for(row: Row, processor):
    """The VideoSettings of `processor`, or the row's BadRowError when no family reads videos for it."""
    from ..families import video_settings_of

    settings = video_settings_of(processor)
    if settings is None:
        raise row.error(f"it has videos, and {type(processor).__name__} reads none here (video files are read for "
                        f"the {VIDEO_FAMILIES} processors: docs/video.md)")
    return settings


def _sampled(row: Row, path: str, settings):
    """(header, kept frame indices) of one clip, or the row's BadRowError naming the file."""
    from ..families.qwen2_vl.video_frames import sample_indices

    try:
        header = clip_header(path)
    except ValueError as exc:
        raise row.error(str(exc)) from exc
    try:
        return header, sample_indices(settings, header.frames, header.fps)
    except ValueError as exc:
        raise row.error(f"video {path} {exc}") from exc


def _metadata(header, indices, settings):
    from ..families.qwen2_vl.video_frames import clip_fps, clip_metadata

    return clip_metadata(header.frames, clip_fps(header.fps, settings.rule), indices, header.height, header.width)


def measure_clips(row: Row, processor) -> list[tuple[list[int], Any]]:
    """Each clip's `video_grid_thw` and metadata from its header alone."""
    from ..families.qwen2_vl.video_frames import clip_grid

    settings, clips = video_settings_for(row, processor), []
    for path in row.videos:
        header, indices = _sampled(row, path, settings)
        try:
            grid = clip_grid(settings, len(indices), header.height, header.width)
        except ValueError as exc:
            raise row.error(f"video {path} {exc}") from exc
        clips.append((list(grid), _metadata(header, indices, settings)))
    return clips


def clip_texts(processor, clips: list[tuple[list[int], Any]]) -> list[str]:
    """Each clip's placeholder text, written by the processor's own `replace_video_token` (Qwen3-VL: a
    timestamp and a run per temporal patch)."""
    from ..families import video_settings_of

    proc = with_clips(processor, video_settings_of(processor), [m for _, m in clips])
    inputs = {"video_grid_thw": torch.tensor([g for g, _ in clips]), "video_metadata": [m for _, m in clips]}
    return [proc.replace_video_token(inputs, video_idx=k) for k in range(len(clips))]


def load_clips(row: Row, processor) -> tuple[list, Any, list]:
    """(the kept frames of every clip, uint8 RGB [F, H, W, 3]; the settings; their metadata), decoded."""
    settings = video_settings_for(row, processor)
    frames, metadata = [], []
    for path in row.videos:
        header, indices = _sampled(row, path, settings)
        try:
            frames.append(decode_frames(path, indices))
        except ValueError as exc:
            raise row.error(str(exc)) from exc
        metadata.append(_metadata(header, indices, settings))
    return frames, settings, metadata


def with_clips(processor, settings, metadata: list):
    """A shallow copy of `processor` whose video processor is a FramesVideoProcessor for these clips."""
    from ..families.qwen2_vl.video_frames import FramesVideoProcessor

    proc = copy.copy(processor)
    proc.video_processor = FramesVideoProcessor(settings, metadata)
    return proc
