"""Video clips in the Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5): the vision items of a sample.

A sample may carry images (`pixel_values` [patches, D], `image_grid_thw` [n, 3]) and videos
(`pixel_values_videos` [patches, D], `video_grid_thw` [n, 3]: t temporal patches of h x w), as the
processors emit them. The towers take both alike: a video is an image of t temporal patches, and
every block attends within one temporal patch (the towers' `cu_seqlens` cut the patches frame by frame),
so a clip is t frames of independent encoder work.

How a clip appears in `input_ids` differs by family:
    Qwen2-VL, Qwen2.5-VL   one run of t*h*w / merge^2 video placeholders between vision start/end
                           (one vision item: the clip)
    Qwen3-VL, Qwen3.5      one run per temporal patch, each between vision start/end and after its
                           timestamp text ("<0.5 seconds>"): t vision items of h*w / merge^2 rows, the
                           model's `get_rope_index` splits `video_grid_thw` per frame the same way
The vision stage encodes a sample's items in sequence order, so its rows fill image and video
placeholders alike in the order the language model reads them; an item (image, clip or frame) is the
unit the step plan balances over the encoder's dp ranks.
"""

from __future__ import annotations

from typing import Any

import torch

from ..qwen2_5_omni.adapter import typed_runs

KINDS = (("image", "pixel_values", "image_grid_thw"), ("video", "pixel_values_videos", "video_grid_thw"))


def item_grids(grid: torch.Tensor | None, frame_runs: bool) -> torch.Tensor:
    """[items, 3] of one kind: the grids as given, or with `frame_runs` each video split into its
    temporal patches ([t, h, w] -> t x [1, h, w], as Qwen3-VL's `get_rope_index` splits them)."""
    grid = torch.zeros(0, 3, dtype=torch.long) if grid is None else grid.reshape(-1, 3).long()
    if not frame_runs or grid.shape[0] == 0:
        return grid
    frames = torch.repeat_interleave(grid, grid[:, 0], dim=0)
    frames[:, 0] = 1
    return frames


def vision_items(sample: dict[str, Any], token_ids: tuple[int, int], frame_runs: bool
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(patches, grid [1, 3]) of every vision item of the sample, in sequence order (images and
    videos interleaved as their placeholder runs are; `token_ids` = (image id, video id))."""
    pieces = {}
    for token, (kind, pixels, grids) in zip(token_ids, KINDS):
        grid = item_grids(sample.get(grids), frame_runs and kind == "video")
        starts = [0] + grid.prod(-1).cumsum(0).tolist()
        pieces[token] = iter([(sample[pixels][starts[k]:starts[k + 1]], grid[k:k + 1]) for k in range(grid.shape[0])])
    return [next(pieces[token]) for token, _ in typed_runs(sample["input_ids"], token_ids)]


def mm_token_types(input_ids: torch.Tensor, image_id: int, video_id: int) -> torch.Tensor:
    """The processor's `mm_token_type_ids`: 1 at image placeholders, 2 at video ones, 0 elsewhere
    (what `get_rope_index` groups the sequence by)."""
    return (input_ids == image_id).int() + 2 * (input_ids == video_id).int()


def check_vision_items(sample: dict[str, Any], index: int, token_ids: tuple[int, int], merge: int,
                       frame_runs: bool) -> None:
    """A ValueError naming the field when a sample's placeholder runs, grids and patches disagree."""
    for token, (kind, pixels, grids) in zip(token_ids, KINDS):
        grid = sample.get(grids)
        if grid is not None and sample.get(pixels) is None:
            raise ValueError(f"sample {index}: {grids} without {pixels}")
        if grid is None and sample.get(pixels) is not None:
            raise ValueError(f"sample {index}: {pixels} without {grids}")
        runs = [n for t, n in typed_runs(sample["input_ids"], token_ids) if t == token]
        per_item = (item_grids(grid, frame_runs and kind == "video").prod(-1) // merge**2).tolist()
        shown = None if grid is None else grid.reshape(-1, 3).tolist()
        if sum(runs) != sum(per_item):
            raise ValueError(f"sample {index}: {sum(runs)} {kind} placeholder tokens (id {token}) but {grids} "
                             f"{shown} gives {sum(per_item)}")
        if runs != per_item:
            unit = "each temporal patch of a video" if frame_runs and kind == "video" else f"each {kind}"
            raise ValueError(
                f"sample {index}: {kind} placeholder runs {runs} (id {token}) do not match {grids} "
                f"{shown}, which gives {per_item}; {unit} needs "
                "its own run (vision start/end tokens around it)")
        if grid is not None and sample[pixels].shape[0] != int(grid.reshape(-1, 3).prod(-1).sum()):
            raise ValueError(
                f"sample {index}: {pixels} has {sample[pixels].shape[0]} patches but {grids} "
                f"{grid.reshape(-1, 3).tolist()} needs {int(grid.reshape(-1, 3).prod(-1).sum())}")
