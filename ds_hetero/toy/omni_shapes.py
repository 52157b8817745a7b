"""Shapes captioning heard and seen: samples for the Qwen2.5-Omni thinker with an image, a clip, both, or neither.

The scene of item i (shapes.py) is shown as an image, described by a synthetic *clip*, both, or
neither, cycling by index: i % 4 == 0 image only, 1 clip only, 2 clip then image (two encoders'
placeholders in one sample), 3 text only. The caption is the target in every case, so the
task is learnable from either modality.

A clip is a mel spectrogram `[n_mel, frames]`: one segment of `SEGMENT` frames per shape, in
reading order; in its segment a shape sounds as a band of energy whose mel bin encodes its
colour and kind and whose onset encodes its cell, plus noise. Its placeholder count is the audio
tower's output length for its frames (families/qwen2_5_omni/adapter.py `audio_output_length`).

Layout: [bos] [audio_start, audio x n, audio_end] [vision_start, image x n, vision_end] caption [eos];
labels on the caption and eos only.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..loss import IGNORE_INDEX
from ..families.qwen2_vl.sample_format import Qwen2VLFormat
from .shapes import COLOURS, SHAPES, Shape, ShapesCaptionDataset, Vocabulary

SEGMENT = 12  # mel frames per shape


def audio_rows(frames: int) -> int:
    """Placeholders of a clip of `frames` frames (the audio tower's stride-2 conv and stride-2 pooling)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def speak(scene: Sequence[Shape], grid: int, n_mel: int, gen: torch.Generator, noise: float = 0.1) -> torch.Tensor:
    """The clip of a scene: [n_mel, SEGMENT * len(scene)]."""
    kinds = len(COLOURS) * len(SHAPES)
    clip = noise * torch.randn(n_mel, SEGMENT * len(scene), generator=gen)
    colours = list(COLOURS)
    for k, s in enumerate(sorted(scene, key=lambda s: (s.row, s.col))):
        band = (colours.index(s.colour) * len(SHAPES) + SHAPES.index(s.kind)) * n_mel // kinds
        onset = (s.row * grid + s.col) * (SEGMENT // 2) // (grid * grid)
        clip[band: band + max(1, n_mel // kinds), k * SEGMENT + onset: (k + 1) * SEGMENT] += 1.0
    return clip


class OmniShapesDataset(ShapesCaptionDataset):
    """ShapesCaptionDataset whose samples take the thinker's image and audio fields."""

    def __init__(self, size: int, model_config, seed: int = 0, image_sizes=((16, 16), (32, 16), (16, 32)), **kwargs):
        c, v = model_config, model_config.vision_config
        self.ids = c
        self.n_mel = c.audio_config.num_mel_bins
        vocab = Vocabulary(c.text_config.vocab_size, c.image_token_id, reserved_ids=(
            c.video_token_id, c.vision_start_token_id, c.vision_end_token_id, c.audio_token_id,
            c.audio_start_token_id, c.audio_end_token_id))
        fmt = Qwen2VLFormat(v.patch_size, v.spatial_merge_size, v.temporal_patch_size,
                            c.vision_start_token_id, c.vision_end_token_id)
        super().__init__(size, seed=seed, image_sizes=image_sizes, vocab=vocab, sample_format=fmt, **kwargs)

    def modalities(self, index: int) -> tuple[bool, bool]:
        """(has a clip, has an image) of item `index`."""
        kind = index % 4
        return kind in (1, 2), kind in (0, 2)

    def image_hw(self, index: int) -> tuple[int, int] | None:
        return super().image_hw(index) if self.modalities(index)[1] else None

    def _prefix(self, index: int) -> list[int]:
        has_clip, _ = self.modalities(index)
        if not has_clip:
            return []
        c = self.ids
        return [c.audio_start_token_id, *[c.audio_token_id] * audio_rows(SEGMENT * len(self.scene(index))),
                c.audio_end_token_id]

    def input_ids(self, index: int) -> torch.Tensor:
        ids = super().input_ids(index)  # [bos] [image block] caption [eos]
        return torch.cat([ids[:1], torch.tensor(self._prefix(index), dtype=ids.dtype), ids[1:]])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = super().__getitem__(index)
        prefix = self._prefix(index)
        if not prefix:
            return sample
        gen = torch.Generator().manual_seed(self.seed * 7919 + index)  # the clip's own stream
        clip = speak(self.scene(index), self.grid, self.n_mel, gen)
        extra = torch.tensor(prefix, dtype=sample["input_ids"].dtype)
        ignore = torch.full((len(prefix),), IGNORE_INDEX, dtype=sample["labels"].dtype)
        sample["input_ids"] = torch.cat([sample["input_ids"][:1], extra, sample["input_ids"][1:]])
        sample["labels"] = torch.cat([sample["labels"][:1], ignore, sample["labels"][1:]])
        sample["input_features"] = clip
        sample["audio_feature_lengths"] = torch.tensor([clip.shape[1]])
        return sample
