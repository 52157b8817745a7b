"""Qwen2-VL (`Qwen2VLForConditionalGeneration`) split into two stages.

    vision   : patch embed + vision blocks + merger   pixel_values [patches, D], grid_thw [n_img, 3]
                                                      -> rows [sum_i t*h*w / merge^2, H_text]
    language : embeddings + decoder + lm_head          (shared with LLaVA: LanguageStage)

Images differ in size, so samples differ in image-token count: a sample's count is
t*h*w / spatial_merge^2 of its `image_grid_thw`. Video clips (`pixel_values_videos`,
`video_grid_thw`) are vision items beside the images, encoded by the same tower and delivered to the
video placeholders (video.py). The multimodal rotary positions (M-RoPE) are data, computed from
`input_ids`, `mm_token_type_ids` and both grids (Qwen2.5-VL: and `second_per_grid_ts`) by the
model's own `get_rope_index` and handed to the language stage as `position_ids`.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ...models.item_cost import transformer_cost
from ...models.adapter import EncoderPort, StageAdapter
from ...models.language_stage import LanguageStage, empty_rows
from ..qwen2_5_omni.adapter import typed_runs
from .video import check_vision_items, mm_token_types, vision_items

# A Qwen2-VL / Qwen2.5-VL clip is one placeholder run whose frame count `input_ids` do not say;
# its frames attend within themselves, at most this many merged tokens each (the video processors'
# default `max_pixels`, 768 x 28 x 28: 768 tokens a frame), which bounds the attention its cost counts.
FRAME_TOKENS = 768


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
    return {"vision": Qwen2VLVisionStage(model), "language": LanguageStage(
        model.model.language_model, model.lm_head, vision_token_ids(model.config))}


def vision_token_ids(cfg) -> tuple[tuple[int, int]]:
    """The language stage's placeholder ids: the one vision encoder fills image and video placeholders."""
    return ((cfg.image_token_id, cfg.video_token_id),)


class Qwen2VLAdapter(StageAdapter):
    """Samples carry `pixel_values` [patches, D] and `image_grid_thw` [n, 3] (n images, each its own
    run of placeholders, in order), `pixel_values_videos` [patches, D] and `video_grid_thw` [n, 3]
    (n clips), either, both or neither (video.py)."""
    SAMPLE_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
    # Whether a clip's temporal patches are separate placeholder runs (Qwen3-VL, Qwen3.5: video.py).
    FRAME_RUNS = False
    # The field of each clip's seconds per temporal patch that its positions read (Qwen2.5-VL).
    SECONDS_FIELD: str | None = None

    # the merger is Qwen2-VL's projector (models/freeze.py)
    FREEZE_GROUPS = {"vision": {"tower": ["model.visual.patch_embed.*", "model.visual.blocks.*"],
                                "projector": ["model.visual.merger.*"]}}

    def __init__(self, model: nn.Module):
        self.model = model
        cfg = model.config
        self.image_token_id = cfg.image_token_id
        self.video_token_id = cfg.video_token_id
        self.pad_token_id = cfg.text_config.pad_token_id or 0
        v = cfg.vision_config
        self.merge = v.spatial_merge_size
        self.patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size
        self._vision_width = self.tower_width(v)

    @staticmethod
    def tower_width(vision_config) -> tuple[int, int]:
        """(hidden, MLP width) of one vision block, for image_cost."""
        return vision_config.embed_dim, int(vision_config.embed_dim * vision_config.mlp_ratio)

    def encoders(self) -> dict[str, EncoderPort]:
        ports = getattr(self, "_ports", None)
        if ports is None:
            ports = self._ports = {"vision": EncoderPort(
                "vision", self.image_token_id, self.image_rows, self.image_cost, self.select_images,
                self.vision_inputs, more_ids=(self.video_token_id,), costs=self.item_costs)}
        return ports

    @property
    def vision_ids(self) -> tuple[int, int]:
        return self.image_token_id, self.video_token_id

    def image_rows(self, sample: dict[str, Any]) -> list[int]:
        """Rows of each vision item (image, clip or frame: video.py), one placeholder run each
        (the processor wraps it in vision start/end), in sequence order."""
        return [n for _, n in typed_runs(sample["input_ids"], self.vision_ids)]

    def image_cost(self, rows: int) -> int:
        # An image is one frame (t = 1): its blocks attend over all its patches, merge^2 per row.
        return self.attention_cost(rows, rows * self.merge**2)

    def video_cost(self, rows: int) -> int:
        """A clip in one run: its frames attend within themselves, at most FRAME_TOKENS rows each."""
        return self.attention_cost(rows, min(rows, FRAME_TOKENS) * self.merge**2)

    def attention_cost(self, rows: int, attended: int) -> int:
        """The tower's work for `rows` rows whose patches attend over `attended` patches each."""
        return transformer_cost(rows * self.merge**2, attended, *self._vision_width)

    def item_costs(self, sample: dict[str, Any]) -> list[int]:
        """The encoder's work for each vision item, from `input_ids` alone: an image (or a frame of its
        own run) attends over its patches, a clip of one run per frame over each frame."""
        clip = self.video_token_id if not self.FRAME_RUNS else None
        return [self.video_cost(n) if token == clip else self.image_cost(n)
                for token, n in typed_runs(sample["input_ids"], self.vision_ids)]

    def select_images(self, sample: dict[str, Any], images: Sequence[int]) -> dict[str, Any]:
        """The tower's inputs for these vision items (indices in sequence order, images and videos
        alike) as one list of images: the tower treats a clip as an image of t temporal patches."""
        grid = sample.get("image_grid_thw")
        if sample.get("video_grid_thw") is None and grid is not None and len(images) == grid.reshape(-1, 3).shape[0]:
            return sample
        items = vision_items(sample, self.vision_ids, self.FRAME_RUNS)
        return {"pixel_values": torch.cat([items[k][0] for k in images]),
                "image_grid_thw": torch.cat([items[k][1] for k in images])}

    def split(self) -> dict[str, nn.Module]:
        return split_qwen2_vl(self.model)

    def vision_modules(self) -> list[nn.Module]:
        return [self.model.model.visual]  # blocks and merger

    def vision_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Every image and video of the samples, samples in order, items in sequence order."""
        samples = [s if s.get("video_grid_thw") is None else self.select_images(s, range(len(self.image_rows(s))))
                   for s in samples]
        with_image = [s for s in samples if s.get("image_grid_thw") is not None]
        if not with_image:
            return {"pixel_values": torch.zeros(0, self.patch_dim), "image_grid_thw": torch.zeros(0, 3, dtype=torch.long)}
        return {
            "pixel_values": torch.cat([s["pixel_values"] for s in with_image]),
            "image_grid_thw": torch.cat([s["image_grid_thw"].reshape(-1, 3) for s in with_image]),
        }

    def rope_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor | None]:
        """`get_rope_index`'s grid (and seconds) arguments for these samples, as the processor batches them."""
        def cat(key, shape=(-1,)):
            parts = [s[key].reshape(shape) for s in samples if s.get(key) is not None]
            return torch.cat(parts) if parts else None

        out = {"image_grid_thw": cat("image_grid_thw", (-1, 3)), "video_grid_thw": cat("video_grid_thw", (-1, 3))}
        field = self.SECONDS_FIELD
        if field is not None:  # a clip without its seconds takes the model's default, 1 s per temporal patch
            seconds = [s[field].reshape(-1).float() if s.get(field) is not None
                       else torch.ones(s["video_grid_thw"].reshape(-1, 3).shape[0])
                       for s in samples if s.get("video_grid_thw") is not None]
            out[field] = torch.cat(seconds) if seconds else None
        return out

    def position_ids(self, batch: dict[str, torch.Tensor], samples: Sequence[dict[str, Any]]) -> torch.Tensor | None:
        position_ids, _ = self.model.model.get_rope_index(
            batch["input_ids"], mm_token_type_ids=mm_token_types(batch["input_ids"], *self.vision_ids),
            attention_mask=batch["attention_mask"], **self.rope_inputs(samples))
        return position_ids

    def check_sample(self, sample: dict[str, Any], index: int) -> None:
        super().check_sample(sample, index)
        check_vision_items(sample, index, self.vision_ids, self.merge, self.FRAME_RUNS)
        videos, field = sample.get("video_grid_thw"), self.SECONDS_FIELD
        if videos is not None and field is not None and sample.get(field) is not None \
                and sample[field].numel() != videos.reshape(-1, 3).shape[0]:
            raise ValueError(f"sample {index}: {field} needs one entry per video ({videos.reshape(-1, 3).shape[0]}), "
                             "as the processor gives it")
