"""Gemma 4's media fields as its processor emits them, cut per item and batched again for an encoder.

    image  `pixel_values` [n, P, 3 p^2] (patchified, padded to P patches per image) with
           `image_position_ids` [n, P, 2] (each patch's (x, y); (-1, -1) on padding). An image of
           N real patches gives N / k^2 soft tokens (k = `pooling_kernel_size`): one run of image
           placeholders between <boi> and <eoi>.
    audio  `input_features` [n, F, n_mel] (log-mel frames, padded to F per clip) with
           `input_features_mask` [n, F] (True on real frames, a prefix). A clip of L real frames gives
           ceil(ceil(L / 2) / 2) soft tokens (two stride-2 convolutions, as the processor counts them):
           one run of audio placeholders between <boa> and <eoa>.

An encoder's rows for an item do not depend on how far it is padded: the vision tower masks padded
patches out of attention and pooling, the audio tower zeroes padded frames before each convolution,
masks them out of attention, and its depthwise conv is causal. So a rank batches the items it holds
padded to their own longest, and the rows equal those of the fused model's batch.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def audio_tokens(frames: int) -> int:
    """Soft tokens of a clip of `frames` real mel frames (Gemma4Processor.replace_audio_token)."""
    for _ in range(2):
        frames = (frames + 1) // 2
    return frames


def pad_dim1(tensors: Sequence[torch.Tensor], length: int, value) -> torch.Tensor:
    """Concatenate [n_i, L_i, ...] tensors on dim 0, each padded on dim 1 to `length` with `value`."""
    out = []
    for t in tensors:
        if t.shape[1] < length:
            pad = t.new_full((t.shape[0], length - t.shape[1], *t.shape[2:]), value)
            t = torch.cat([t, pad], dim=1)
        out.append(t)
    return torch.cat(out)


def image_fields(sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    pixels = sample.get("pixel_values")
    if pixels is None:
        return None
    positions = sample["image_position_ids"]
    return pixels.reshape(-1, *pixels.shape[-2:]), positions.reshape(-1, *positions.shape[-2:])


def audio_fields(sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    features = sample.get("input_features")
    if features is None:
        return None
    mask = sample["input_features_mask"]
    return features.reshape(-1, *features.shape[-2:]), mask.reshape(-1, mask.shape[-1]).bool()


def image_soft_tokens(positions: torch.Tensor, k: int) -> list[int]:
    """Soft tokens of each image: its real patches / k^2."""
    return ((positions != -1).all(-1).sum(-1) // (k * k)).tolist()


def batch_images(samples: Sequence[dict[str, Any]], k: int, patch_dim: int) -> dict[str, torch.Tensor]:
    """Every image of the samples, padded to the longest (rounded up to whole pooling kernels)."""
    items = [f for f in (image_fields(s) for s in samples) if f is not None]
    if not items:
        return {"pixel_values": torch.zeros(0, k * k, patch_dim),
                "image_position_ids": torch.zeros(0, k * k, 2, dtype=torch.long)}
    length = max(p.shape[1] for p, _ in items)
    length = -(-length // (k * k)) * (k * k)
    return {"pixel_values": pad_dim1([p for p, _ in items], length, 0.0),
            "image_position_ids": pad_dim1([q for _, q in items], length, -1)}


def batch_audio(samples: Sequence[dict[str, Any]], n_mel: int) -> dict[str, torch.Tensor]:
    """Every clip of the samples, padded to the longest."""
    items = [f for f in (audio_fields(s) for s in samples) if f is not None]
    if not items:
        return {"input_features": torch.zeros(0, 4, n_mel), "input_features_mask": torch.zeros(0, 4, dtype=torch.bool)}
    length = max(f.shape[1] for f, _ in items)
    return {"input_features": pad_dim1([f for f, _ in items], length, 0.0),
            "input_features_mask": pad_dim1([m for _, m in items], length, False)}


def check_media(sample: dict[str, Any], index: int, k: int, n_mel: int, image_runs: list[int],
                audio_runs: list[int]) -> None:
    """A ValueError naming the field where the media fields disagree with the placeholders."""
    images = image_fields(sample) if "pixel_values" in sample else None
    if ("pixel_values" in sample) != ("image_position_ids" in sample):
        given, missing = (("pixel_values", "image_position_ids") if "pixel_values" in sample
                          else ("image_position_ids", "pixel_values"))
        raise ValueError(f"sample {index}: {given} without {missing}; give both, as Gemma4Processor emits them")
    want = [] if images is None else image_soft_tokens(images[1], k)
    if images is not None and tuple(images[0].shape[:2]) != tuple(images[1].shape[:2]):
        raise ValueError(f"sample {index}: pixel_values {tuple(images[0].shape)} and image_position_ids "
                         f"{tuple(images[1].shape)} disagree on images or patches")
    if image_runs != want:
        raise ValueError(f"sample {index}: image placeholder runs {image_runs} do not match the images' soft tokens "
                         f"{want} (real patches / {k * k} per image, from image_position_ids); each image needs its "
                         "own run (<boi> and <eoi> around it)")
    if ("input_features" in sample) != ("input_features_mask" in sample):
        raise ValueError(f"sample {index}: give input_features [clips, frames, {n_mel}] with input_features_mask "
                         "[clips, frames], as Gemma4Processor emits them")
    clips = audio_fields(sample)
    if clips is not None and (clips[0].shape[-1] != n_mel or tuple(clips[0].shape[:2]) != tuple(clips[1].shape)):
        raise ValueError(f"sample {index}: input_features {tuple(clips[0].shape)} and input_features_mask "
                         f"{tuple(clips[1].shape)} do not fit [clips, frames, {n_mel}] and [clips, frames]")
    if clips is not None:
        frames = clips[1].sum(-1)
        prefix = torch.arange(clips[1].shape[1]).unsqueeze(0) < frames.unsqueeze(1)
        if not bool((prefix == clips[1]).all()):
            raise ValueError(f"sample {index}: input_features_mask must mark each clip's real frames as a prefix "
                             "(padding at the end), as the feature extractor pads")
    want = [] if clips is None else [audio_tokens(int(n)) for n in clips[1].sum(-1)]
    if audio_runs != want:
        raise ValueError(f"sample {index}: audio placeholder runs {audio_runs} do not match the clips' soft tokens "
                         f"{want} (from input_features_mask); each clip needs its own run (<boa> and <eoa> around it)")


def patchify(image: torch.Tensor, patch: int, max_patches: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """An image [3, H, W] (pixels in [0, 1]) as Gemma4ImageProcessor gives it: patches [1, N, p * p * 3]
    (rows of patches, each patch's pixels row by row, channels last) and their (x, y) [1, N, 2],
    padded to `max_patches` with zero pixels at (-1, -1)."""
    c, h, w = image.shape
    ph, pw = h // patch, w // patch
    patches = image.reshape(c, ph, patch, pw, patch).permute(1, 3, 2, 4, 0).reshape(ph * pw, -1)
    ys, xs = torch.meshgrid(torch.arange(ph), torch.arange(pw), indexing="ij")
    positions = torch.stack([xs, ys], dim=-1).reshape(-1, 2)
    if max_patches is not None and max_patches > patches.shape[0]:
        extra = max_patches - patches.shape[0]
        patches = torch.cat([patches, patches.new_zeros(extra, patches.shape[1])])
        positions = torch.cat([positions, positions.new_full((extra, 2), -1)])
    return patches.unsqueeze(0), positions.unsqueeze(0)
