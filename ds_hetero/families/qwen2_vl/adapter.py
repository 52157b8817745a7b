"""Qwen2-VL (`Qwen2VLForConditionalGeneration`) split into two stages.

    vision   : patch embed + vision blocks + merger   pixel_values [patches, D], grid_thw [n_img, 3]
                                                      -> rows [sum_i t*h*w / merge^2, H_text]
    language : embeddings + decoder + lm_head          (shared with LLaVA: LanguageStage)

Images differ in size, so samples differ in image-token count: a sample's count is
t*h*w / spatial_merge^2 of its `image_grid_thw`. The multimodal rotary positions (M-RoPE) are
data, computed from `input_ids`, `mm_token_type_ids` and `image_grid_thw` by the model's own
`get_rope_index` and handed to the language stage as `position_ids`.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ...models.item_cost import transformer_cost
from ...models.adapter import StageAdapter
from ...models.language_stage import LanguageStage, empty_rows


class Qwen2VLVisionStage(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.visual = model.model.visual

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        if image_grid_thw.shape[0] == 0:  # the smallest image: one merged token
            m = self.visual.spatial_merge_size
            grid = image_grid_thw.new_tensor([[1, m, m]])
            return empty_rows(self, {"pixel_values": pixel_values.new_zeros(m * m, pixel_values.shape[-1]),
                                     "image_grid_thw": grid})
        return self.encode(pixel_values.to(self.input_dtype()), image_grid_thw)

    def input_dtype(self) -> torch.dtype:
        """The tower's compute dtype, read from its last layer (the patches arrive in fp32)."""
        return self.visual.merger.mlp[-1].weight.dtype

    def encode(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        return self.visual(pixel_values, grid_thw=image_grid_thw).pooler_output


def split_qwen2_vl(model: nn.Module) -> dict[str, nn.Module]:
    language = LanguageStage(model.model.language_model, model.lm_head, model.config.image_token_id)
    return {"vision": Qwen2VLVisionStage(model), "language": language}


class Qwen2VLAdapter(StageAdapter):
    """Samples carry `pixel_values` [patches, D] and `image_grid_thw` [n, 3] (n images, each its own
    run of placeholders, in order) or neither."""
    SAMPLE_FIELDS = ("pixel_values", "image_grid_thw")

    # the merger is Qwen2-VL's projector (models/freeze.py)
    FREEZE_GROUPS = {"vision": {"tower": ["model.visual.patch_embed.*", "model.visual.blocks.*"],
                                "projector": ["model.visual.merger.*"]}}

    def __init__(self, model: nn.Module):
        self.model = model
        cfg = model.config
        self.image_token_id = cfg.image_token_id
        self.pad_token_id = cfg.text_config.pad_token_id or 0
        v = cfg.vision_config
        self.merge = v.spatial_merge_size
        self.patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size
        self._vision_width = self.tower_width(v)

    @staticmethod
    def tower_width(vision_config) -> tuple[int, int]:
        """(hidden, MLP width) of one vision block, for image_cost."""
        return vision_config.embed_dim, int(vision_config.embed_dim * vision_config.mlp_ratio)

    def image_rows(self, sample: dict[str, Any]) -> list[int]:
        """Each image is one run of placeholders (the processor wraps it in vision start/end)."""
        ids = sample["input_ids"].reshape(-1)
        is_image = (ids == self.image_token_id).int()
        edges = torch.diff(is_image, prepend=is_image.new_zeros(1), append=is_image.new_zeros(1))
        starts, ends = torch.nonzero(edges == 1).flatten(), torch.nonzero(edges == -1).flatten()
        return (ends - starts).tolist()

    def image_cost(self, rows: int) -> int:
        # An image is one frame (t = 1): its blocks attend over all its patches, merge^2 per row.
        patches = rows * self.merge**2
        return transformer_cost(patches, patches, *self._vision_width)

    def select_images(self, sample: dict[str, Any], images: Sequence[int]) -> dict[str, Any]:
        grid = sample["image_grid_thw"].reshape(-1, 3)
        if len(images) == grid.shape[0]:
            return sample
        starts = [0] + grid.prod(-1).cumsum(0).tolist()
        pixels = torch.cat([sample["pixel_values"][starts[k]:starts[k + 1]] for k in images])
        return {"pixel_values": pixels, "image_grid_thw": grid[list(images)]}

    def split(self) -> dict[str, nn.Module]:
        return split_qwen2_vl(self.model)

    def vision_modules(self) -> list[nn.Module]:
        return [self.model.model.visual]  # blocks and merger

    def vision_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        with_image = [s for s in samples if s.get("image_grid_thw") is not None]
        if not with_image:
            return {"pixel_values": torch.zeros(0, self.patch_dim), "image_grid_thw": torch.zeros(0, 3, dtype=torch.long)}
        return {
            "pixel_values": torch.cat([s["pixel_values"] for s in with_image]),
            "image_grid_thw": torch.cat([s["image_grid_thw"].reshape(-1, 3) for s in with_image]),
        }

    def position_ids(self, batch: dict[str, torch.Tensor], samples: Sequence[dict[str, Any]]) -> torch.Tensor | None:
        grids = [s["image_grid_thw"].reshape(-1, 3) for s in samples if s.get("image_grid_thw") is not None]
        mm_types = (batch["input_ids"] == self.image_token_id).int()
        position_ids, _ = self.model.model.get_rope_index(
            batch["input_ids"], mm_token_type_ids=mm_types,
            image_grid_thw=torch.cat(grids) if grids else None, attention_mask=batch["attention_mask"],
        )
        return position_ids

    def check_sample(self, sample: dict[str, Any], index: int) -> None:
        super().check_sample(sample, index)
        grid = sample.get("image_grid_thw")
        expected = 0 if grid is None else int(grid.reshape(-1, 3).prod(-1).sum()) // (self.merge**2)
        found = self.image_token_count(sample)
        if found != expected:
            raise ValueError(
                f"sample {index}: {found} image placeholder tokens (id {self.image_token_id}) but "
                f"image_grid_thw {None if grid is None else grid.reshape(-1, 3).tolist()} gives {expected}"
            )
        if grid is not None:
            per_image = (grid.reshape(-1, 3).prod(-1) // self.merge**2).tolist()
            if self.image_rows(sample) != per_image:
                raise ValueError(
                    f"sample {index}: image placeholder runs {self.image_rows(sample)} do not match the images "
                    f"of image_grid_thw {per_image}; each image needs its own run (vision start/end tokens around it)")
        if grid is not None and sample["pixel_values"].shape[0] != int(grid.reshape(-1, 3).prod(-1).sum()):
            raise ValueError(
                f"sample {index}: pixel_values has {sample['pixel_values'].shape[0]} patches but "
                f"image_grid_thw {grid.reshape(-1, 3).tolist()} needs {int(grid.reshape(-1, 3).prod(-1).sum())}"
            )
