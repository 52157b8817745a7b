"""Synthetic "moving shapes" video clips for the Qwen-VL families: a tiny VLM learns them on a CPU, and only
by reading the frames in time order.

A clip shows one shape (toy/shapes.py's colours, kinds and 2x2 grid) in one cell for its first half and in
another cell for its second half; its caption names both places in that order:

    "a red circle at the top left and at the bottom right"

(one place when it stays). A clip has 2 x t frames (t temporal patches of the model's
`temporal_patch_size` 2), `frames` cycled by index. Every item is a pure function of (seed, index), and
its `input_ids` come without rendering (`input_ids(i)`), as the shapes dataset's.

Format, as the processors lay it out: [bos] + the clip's placeholders + caption + [eos]; the clip's
patches `pixel_values_videos` [t*h*w, C*T*p*p] in the processor's patch order and `video_grid_thw`
[[t, h, w]]. Qwen2-VL / Qwen2.5-VL: one <vision_start> video x (t*h*w / merge^2) <vision_end> run
(Qwen2.5-VL: `second_per_grid_ts` [1.0]); Qwen3-VL / Qwen3.5 (`FRAME_RUNS`): one such run per temporal
patch (their processors write a timestamp text before each; the clips leave it out).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.utils.data import Dataset

from ..families.qwen2_vl.video_frames import patch_rows
from ..models.labels import text_labels
from .shapes import COLS, ROWS, Shape, Vocabulary, draw_scene, item_seed, render


def clip_caption(first: Shape, last: Shape) -> str:
    start = f"a {first.colour} {first.kind} at the {ROWS[2][first.row]} {COLS[2][first.col]}"
    if (first.row, first.col) == (last.row, last.col):
        return start
    return f"{start} and at the {ROWS[2][last.row]} {COLS[2][last.col]}"


class ShapeClipsDataset(Dataset):
    """`size` captioned clips for a Qwen-VL model (its adapter says how a clip's runs are laid out)."""

    def __init__(self, model, size: int, seed: int = 0, frames: Sequence[int] = (4, 8), side: int = 16):
        from ..families import adapter_for

        cfg, self.adapter = model.config, adapter_for(model)
        v = cfg.vision_config
        self.patch, self.merge, self.temporal = v.patch_size, v.spatial_merge_size, v.temporal_patch_size
        if side % (self.patch * self.merge) or any(f % self.temporal for f in frames):
            raise ValueError(f"side {side} must be a multiple of patch x merge = {self.patch * self.merge} and "
                             f"frames {list(frames)} multiples of temporal_patch_size {self.temporal}")
        self.size, self.seed, self.frames, self.side = int(size), int(seed), tuple(frames), side
        self.start_id, self.end_id = cfg.vision_start_token_id, cfg.vision_end_token_id
        self.vocab = Vocabulary(cfg.text_config.vocab_size, cfg.image_token_id,
                                (cfg.video_token_id, self.start_id, self.end_id))

    def __len__(self) -> int:
        return self.size

    def _scene(self, index: int) -> tuple[torch.Generator, Shape, Shape]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} clips")
        gen = torch.Generator().manual_seed(item_seed(self.seed, index))
        first = draw_scene(gen, 2, 1)[0]
        cell = int(torch.randint(4, (1,), generator=gen))
        return gen, first, Shape(first.colour, first.kind, cell // 2, cell % 2)

    def _placeholders(self, index: int) -> list[int]:
        t = self.frames[index % len(self.frames)] // self.temporal
        per_frame = (self.side // self.patch) ** 2 // self.merge**2
        runs = [per_frame] * t if self.adapter.FRAME_RUNS else [per_frame * t]
        token = self.adapter.video_token_id
        return [i for n in runs for i in (self.start_id, *[token] * n, self.end_id)]

    def input_ids(self, index: int) -> torch.Tensor:
        """The clip's `input_ids` without rendering its frames."""
        _, first, last = self._scene(index)
        caption = self.vocab.encode(clip_caption(first, last))
        return torch.tensor([self.vocab.bos_id, *self._placeholders(index), *caption, self.vocab.eos_id])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        gen, first, last = self._scene(index)
        n = self.frames[index % len(self.frames)]
        frames = torch.stack([render([first if k < n // 2 else last], 2, self.side, self.side, gen)
                              for k in range(n)])
        ids = self.input_ids(index)
        g = self.side // self.patch
        sample = {"input_ids": ids, "labels": text_labels(ids, 1 + len(self._placeholders(index))),
                  "pixel_values_videos": patch_rows(frames, self.patch, self.merge, self.temporal),
                  "video_grid_thw": torch.tensor([[n // self.temporal, g, g]])}
        if self.adapter.SECONDS_FIELD is not None:
            sample[self.adapter.SECONDS_FIELD] = torch.tensor([1.0])
        return sample
