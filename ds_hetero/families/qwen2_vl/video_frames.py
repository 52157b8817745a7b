"""A video file's frames as the Qwen-VL video processors make them: which frames, at what size, in what patch order.

    settings = video_settings(processor, "qwen2")          # read from processor.video_processor (or defaults)
    indices = sample_indices(settings, total_frames, fps)  # the frames kept, from the container's header alone
    grid = clip_grid(settings, len(indices), height, width)  # (t, h, w) patches: the token count, without pixels
    patches, grid = clip_pixels(settings, frames)          # [t*h*w, C*T*p*p] from the sampled frames (uint8 RGB)

transformers' Qwen-VL video processors need torchvision (not built for the pinned CPU torch), so their rules
are implemented here, read from transformers 5.23's video_processing_qwen2_vl.py / video_processing_qwen3_vl.py:

- Qwen2-VL, Qwen2.5-VL ("qwen2"): `fps` frames a second of the clip's length, at least `min_frames`, at most
  `max_frames` and the clip's frames, rounded down to a multiple of the temporal patch size; the kept frames
  evenly spaced from frame 0 (`arange(0, total, total / n)`). Each frame resized by the image rule
  `smart_resize` (sides multiples of patch x merge, pixels between the video processor's min and max).
- Qwen3-VL, Qwen3.5 ("qwen3"): `int(seconds x fps)` frames clamped the same way but not rounded (an odd count
  repeats its last frame to fill the temporal patch), spaced by `linspace(0, total - 1, n)` rounded (a header
  without a frame rate counts as 24 fps, as transformers does); the resize bounds the whole clip's pixels
  (frames x height x width between min and max pixels), and sides under one patch x merge are scaled up first.
- `cap_pixels_per_frame` (both rules; transformers' default is off): the per-frame cap qwen-vl-utils applies.

A frame is resized with Pillow (bicubic), rescaled and normalized by transformers' own numpy transforms, the
path its PIL image processors take (the torchvision video processors resize tensors with antialiasing, which
rounds slightly differently; the model trains on whatever it is given, and the parity tests feed the reference
model the same pixels). The patch order is the video processors': temporal patch, merge block by merge block,
each row (channel, time, py, px); toy/shape_clips.py lays synthetic clips out with the same `patch_rows`.

Frames are always sampled: transformers' Qwen2-VL video processor keeps `do_sample_frames=False` only for
backward compatibility (every frame of a 30 fps clip), which no training recipe of the model uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

RULES = ("qwen2", "qwen3")
# the video processors' class defaults where a processor has no video processor to read them from
DEFAULT_FPS, DEFAULT_MIN_FRAMES, DEFAULT_MAX_FRAMES = 2.0, 4, 768
MIN_TOKENS, MAX_TOKENS = 128, 768  # min / max pixels = these x (patch x merge)^2 (28 x 28 or 32 x 32 at full size)
DEFAULT_MAX_VIDEO_TOKENS = {"qwen2": 128000, "qwen3": 768}
UNKNOWN_FPS = 24.0  # what transformers' Qwen3-VL sampling assumes for a clip without a frame rate


@dataclass(frozen=True)
class VideoSettings:
    """What decides a clip's frames and pixels (its repr is part of the length index's cache key)."""

    rule: str  # "qwen2" or "qwen3"
    fps: float
    min_frames: int
    max_frames: int
    min_pixels: int
    max_pixels: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    rescale_factor: float = 1 / 255
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def _size_bounds(size: Any) -> tuple[int | None, int | None]:
    if size is None:
        return None, None
    get = size.get if isinstance(size, dict) else lambda k: getattr(size, k, None)
    return get("shortest_edge"), get("longest_edge")


def video_settings(processor, rule: str) -> VideoSettings:
    """The settings of `processor`'s video processor (transformers' own, or a FramesVideoProcessor), each one it
    lacks (or a processor without any video processor) from its image processor's patch sizes, mean and std and
    the video processors' class defaults."""
    if rule not in RULES:
        raise ValueError(f"unknown video rule {rule!r}; known: {', '.join(RULES)}")
    video, image = getattr(processor, "video_processor", None), processor.image_processor

    def pick(name: str, default: Any) -> Any:
        value = getattr(video, name, None) if video is not None else None
        return default if value is None else value

    patch = int(pick("patch_size", image.patch_size))
    merge = int(pick("merge_size", image.merge_size))
    temporal = int(pick("temporal_patch_size", image.temporal_patch_size))
    low, high = _size_bounds(getattr(video, "size", None) if video is not None else None)
    factor = (patch * merge) ** 2
    return VideoSettings(
        rule=rule, fps=float(pick("fps", DEFAULT_FPS)), min_frames=int(pick("min_frames", DEFAULT_MIN_FRAMES)),
        max_frames=int(pick("max_frames", DEFAULT_MAX_FRAMES)),
        min_pixels=int(low if low is not None else MIN_TOKENS * factor),
        max_pixels=int(high if high is not None else MAX_TOKENS * factor),
        patch_size=patch, merge_size=merge, temporal_patch_size=temporal,
        image_mean=tuple(float(x) for x in pick("image_mean", image.image_mean)),
        image_std=tuple(float(x) for x in pick("image_std", image.image_std)),
        rescale_factor=float(pick("rescale_factor", image.rescale_factor)),
        cap_pixels_per_frame=bool(pick("cap_pixels_per_frame", False)),
        max_video_tokens=int(pick("max_video_tokens", DEFAULT_MAX_VIDEO_TOKENS[rule])))


# ------------------------------------------------------------------ which frames
def frame_count(s: VideoSettings, total: int, fps: float | None) -> int:
    """How many frames of a clip of `total` frames at `fps` are kept (ValueError: a clip the rule cannot sample)."""
    if total <= 0:
        raise ValueError("has no frames")
    if s.rule == "qwen2":
        if not fps:
            raise ValueError("has no frame rate in its header (frames are sampled per second)")
        top = math.floor(min(s.max_frames, total) / s.temporal_patch_size) * s.temporal_patch_size
        n = min(max(total / fps * s.fps, s.min_frames), top, total)
        n = math.floor(n / s.temporal_patch_size) * s.temporal_patch_size
    else:
        n = int(total / (fps or UNKNOWN_FPS) * s.fps)
        n = min(max(n, s.min_frames), s.max_frames, total)
        if n < s.temporal_patch_size:  # transformers' Qwen3-VL resize refuses it
            n = 0
    if n <= 0:
        raise ValueError(f"has {total} frame(s): fewer than one temporal patch ({s.temporal_patch_size} frames) "
                         f"can be sampled")
    return int(n)


def sample_indices(s: VideoSettings, total: int, fps: float | None) -> list[int]:
    """The indices (ascending, distinct) of the frames kept of a clip of `total` frames at `fps`."""
    n = frame_count(s, total, fps)
    if s.rule == "qwen2":
        return torch.arange(0, total, total / n).int().tolist()
    return np.linspace(0, total - 1, n).round().astype(int).tolist()


def clip_fps(fps: float | None, rule: str) -> float | None:
    """The frame rate the processor's metadata carries (timestamps, Qwen2.5-VL's seconds per temporal patch)."""
    return fps if fps or rule == "qwen2" else UNKNOWN_FPS


# ------------------------------------------------------------------ what size
def _qwen2_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # the image rule itself

    return smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


def _qwen3_resize(frames: int, height: int, width: int, temporal: int, factor: int, min_pixels: int,
                  max_pixels: int) -> tuple[int, int]:
    """Qwen3-VL's video resize: the clip's pixels (frames x h x w) bounded, sides multiples of `factor`."""
    if height < factor or width < factor:  # too small for one merged patch: scaled up, aspect kept
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"has aspect ratio {max(height, width) / min(height, width):.0f}, above the processor's 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    t = round(frames / temporal) * temporal
    if t * h * w > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h, w = max(factor, math.floor(height / beta / factor) * factor), max(factor, math.floor(width / beta / factor) * factor)
    elif t * h * w < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def frame_size(s: VideoSettings, frames: int, height: int, width: int) -> tuple[int, int]:
    """(height, width) every kept frame of a `height` x `width` clip is resized to, `frames` of them kept."""
    f, low, high = s.factor, s.min_pixels, s.max_pixels
    if s.rule == "qwen2":
        if s.cap_pixels_per_frame:  # an even share of the clip's token budget, floored near the minimum
            budget = int(s.max_video_tokens * f * f * 0.9)
            high = max(min(high, budget * s.temporal_patch_size // frames), int(low * 1.05))
        try:
            return _qwen2_resize(height, width, f, low, high)
        except ValueError as exc:
            raise ValueError(f"cannot be resized ({exc})") from None
    if s.cap_pixels_per_frame:
        per_frame = max(min(s.max_video_tokens * f * f, high // frames), int(low * 1.05))
        high = per_frame * frames
    return _qwen3_resize(frames, height, width, s.temporal_patch_size, f, low, high)


def clip_grid(s: VideoSettings, frames: int, height: int, width: int) -> tuple[int, int, int]:
    """`video_grid_thw` of a clip of `frames` kept frames of `height` x `width`: its token count without pixels."""
    h, w = frame_size(s, frames, height, width)
    return -(-frames // s.temporal_patch_size), h // s.patch_size, w // s.patch_size


# ------------------------------------------------------------------ the pixels
def _frame_pixels(s: VideoSettings, frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """One uint8 RGB frame [H, W, 3] -> [3, height, width] float32, as transformers' PIL image processors
    resize (Pillow bicubic), rescale and normalize an image."""
    from transformers.image_transforms import normalize, rescale, resize
    from transformers.image_utils import ChannelDimension, PILImageResampling

    first = ChannelDimension.FIRST
    image = resize(frame, (height, width), resample=PILImageResampling.BICUBIC, data_format=first,
                   input_data_format=ChannelDimension.LAST)
    image = rescale(image, s.rescale_factor, data_format=first, input_data_format=first)
    return normalize(image, s.image_mean, s.image_std, data_format=first, input_data_format=first)


def patchify(frames: torch.Tensor, s: VideoSettings) -> torch.Tensor:
    """[F, C, H, W] -> [t*h*w, C*T*p*p]: the last frame repeated up to whole temporal patches, rows ordered by
    temporal patch, then merge block by merge block, each row (channel, time, py, px)."""
    if pad := -frames.shape[0] % s.temporal_patch_size:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    return patch_rows(frames, s.patch_size, s.merge_size, s.temporal_patch_size)


def patch_rows(frames: torch.Tensor, patch: int, merge: int, temporal: int) -> torch.Tensor:
    """[F, C, H, W] frames (F a multiple of `temporal`) -> [t*h*w, C*T*p*p] rows in the Qwen-VL video
    processors' order: temporal patch, then merge block by merge block, each row (channel, time, py, px)."""
    n, c, height, width = frames.shape
    t, gh, gw = n // temporal, height // patch, width // patch
    x = frames.reshape(t, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (t, gh/m, gw/m, m, m, c, T, p, p)
    return x.reshape(t * gh * gw, c * temporal * patch * patch)


def clip_pixels(s: VideoSettings, frames: np.ndarray | Sequence[np.ndarray]) -> tuple[torch.Tensor, list[int]]:
    """The kept frames of a clip (uint8 RGB [F, H, W, 3]) -> (`pixel_values_videos` rows, its [t, h, w] grid)."""
    frames = np.asarray(frames)
    height, width = frame_size(s, frames.shape[0], frames.shape[1], frames.shape[2])
    pixels = torch.from_numpy(np.stack([_frame_pixels(s, f, height, width) for f in frames]))
    return patchify(pixels, s), [*clip_grid(s, frames.shape[0], frames.shape[1], frames.shape[2])]


class FramesVideoProcessor:
    """A video processor for the Qwen-VL processors without torchvision: its settings are the attributes
    transformers' own has (what `video_settings` reads), and called by the processor on clips whose frames were
    already sampled (their `metadata`, one per clip, in order) it gives what transformers' would:
    `pixel_values_videos`, `video_grid_thw` and `video_metadata` (the processor turns the latter into Qwen3-VL's
    timestamps and Qwen2.5-VL's `second_per_grid_ts`)."""

    def __init__(self, settings: VideoSettings, metadata: Sequence[Any] = ()):
        self.settings, self.metadata = settings, list(metadata)
        for name in ("fps", "min_frames", "max_frames", "patch_size", "merge_size", "temporal_patch_size",
                     "image_mean", "image_std", "rescale_factor", "cap_pixels_per_frame", "max_video_tokens"):
            setattr(self, name, getattr(settings, name))
        self.size = {"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels}

    def __repr__(self) -> str:
        return f"FramesVideoProcessor({self.settings})"

    def __call__(self, videos: Sequence[np.ndarray], **kwargs: Any):
        from transformers.feature_extraction_utils import BatchFeature

        if len(videos) != len(self.metadata):
            raise ValueError(f"{len(videos)} clip(s) but metadata for {len(self.metadata)}")
        pieces = [clip_pixels(self.settings, v) for v in videos]
        return BatchFeature({"pixel_values_videos": torch.cat([p for p, _ in pieces]),
                             "video_grid_thw": torch.tensor([g for _, g in pieces]),
                             "video_metadata": self.metadata})


def clip_metadata(total: int, fps: float | None, indices: Sequence[int], height: int, width: int):
    """transformers' VideoMetadata of a sampled clip (what its processors read timestamps and seconds from)."""
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(total_num_frames=int(total), fps=fps, height=height, width=width,
                         duration=total / fps if fps else None, frames_indices=list(indices))
