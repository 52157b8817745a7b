"""LLaVA-OneVision (`LlavaOnevisionForConditionalGeneration`, SigLIP + Qwen2) split into two stages.

    vision   : tower + projector + any-resolution packing     pixel_values [tiles, C, H, W],
               image_sizes [n, 2], tiles [n] -> rows [sum of each image's tokens, H_text]
    language : embeddings + decoder + lm_head (LanguageStage)

Any resolution: an image alone in its sample is cut into the grid of its best `image_grid_pinpoints`
resolution plus a base tile; its token count is the base tile's tokens plus the tiles' features
after unpadding (the rows and columns that cover padding are dropped, and the whole grid is
shrunk when it exceeds `anyres_max_N` tiles), plus one `image_newline` row at the end of every
feature row. An image in a sample with several images is its base tile plus one newline. The
packing is transformers' own `pack_image_features`, applied per image, so an image's rows are
the same whichever encoder rank encodes it; `image_newline` is an encoder-stage parameter (its
rows travel over the boundary like every image row).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ...models.item_cost import transformer_cost
from ...models.adapter import StageAdapter
from ..llava.adapter import LlavaVisionStage
from ...models.language_stage import LanguageStage, empty_rows


class LlavaOnevisionVisionStage(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.config = model.config
        self.vision_tower = model.model.vision_tower
        self.multi_modal_projector = model.model.multi_modal_projector
        self.image_newline = model.model.image_newline
        self.feature_layer = model.config.vision_feature_layer
        self.select_strategy = model.config.vision_feature_select_strategy
        self._pack = type(model.model).pack_image_features  # reads only self.config
        # image_newline is a parameter of the model itself (not of a submodule), so this stage holds
        # it directly: keep the model's own reference pointing at the stage's tensor (not a child)
        object.__setattr__(self, "_newline_owner", model.model)

    def _apply(self, fn, recurse=True):
        """`.to("meta")` (a stage held elsewhere) or a dtype change replace image_newline here:
        the model must see the same tensor (its state_dict, save_pretrained)."""
        out = super()._apply(fn, recurse)
        self._newline_owner._parameters["image_newline"] = self.image_newline
        return out

    def forward(self, pixel_values: torch.Tensor, image_sizes: torch.Tensor, tiles: torch.Tensor) -> torch.Tensor:
        if tiles.shape[0] == 0:  # a rank with no image: one base tile of a square image
            side = pixel_values.shape[-1]
            return empty_rows(self, {"pixel_values": pixel_values.new_zeros(1, *pixel_values.shape[1:]),
                                     "image_sizes": tiles.new_tensor([[side, side]]), "tiles": tiles.new_ones(1)})
        pixel_values = pixel_values.to(self.multi_modal_projector.linear_2.weight.dtype)
        out = self.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
        layers = [self.feature_layer] if isinstance(self.feature_layer, int) else list(self.feature_layer)
        selected = torch.cat([out.hidden_states[i] for i in layers], dim=-1)
        if self.select_strategy == "default":
            selected = selected[:, 1:]
        features = self.multi_modal_projector(selected).split(tiles.tolist(), dim=0)
        packed, _ = self._pack(self, features, image_sizes, image_newline=self.image_newline,
                               vision_aspect_ratio=self.config.vision_aspect_ratio)
        return torch.cat(packed, dim=0)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return LlavaVisionStage.trainable_parameters(self)  # the tower up to its feature layer, as LLaVA


def split_llava_onevision(model: nn.Module) -> dict[str, nn.Module]:
    language = LanguageStage(model.model.language_model, model.lm_head, model.config.image_token_id)
    return {"vision": LlavaOnevisionVisionStage(model), "language": language}


class LlavaOnevisionAdapter(StageAdapter):
    """Samples carry `pixel_values` ([n, max_tiles, C, H, W] as the processor pads them, or every
    tile [tiles, C, H, W]) and `image_sizes` [n, 2], each image its own run of placeholders, or
    neither (text only)."""
    SAMPLE_FIELDS = ("pixel_values", "image_sizes", "batch_num_images")

    def __init__(self, model: nn.Module):
        self.model = model
        cfg = model.config
        self.image_token_id = cfg.image_token_id
        self.pad_token_id = cfg.text_config.pad_token_id or 0
        v = cfg.vision_config
        self.image_shape = (v.num_channels, v.image_size, v.image_size)
        self.tokens_per_tile = (v.image_size // v.patch_size) ** 2
        patches = self.tokens_per_tile + int(v.model_type.startswith("clip"))
        self._tile_cost = transformer_cost(patches, patches, v.hidden_size, v.intermediate_size)

    def tiles(self, sample: dict[str, Any]) -> list[int]:
        """Tiles of each image: its any-resolution grid plus the base tile when alone in its sample."""
        from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches

        sizes = sample["image_sizes"].reshape(-1, 2)
        if sizes.shape[0] != 1:
            return [1] * sizes.shape[0]
        return [image_size_to_num_patches(sizes[0].tolist(), self.model.config.image_grid_pinpoints,
                                          self.image_shape[-1])]

    def _tiles_of(self, sample: dict[str, Any]) -> tuple[torch.Tensor, list[int]]:
        """(every tile of the sample [tiles, C, H, W], tiles per image)."""
        counts = sample["tiles"].tolist() if "tiles" in sample else self.tiles(sample)
        pixels = sample["pixel_values"]
        if pixels.dim() == 5:  # the processor pads every image to the sample's largest tile count
            pixels = torch.cat([pixels[i, :k] for i, k in enumerate(counts)])
        return pixels.reshape(-1, *self.image_shape), counts

    def image_rows(self, sample: dict[str, Any]) -> list[int]:
        ids = sample["input_ids"].reshape(-1)
        is_image = (ids == self.image_token_id).int()
        edges = torch.diff(is_image, prepend=is_image.new_zeros(1), append=is_image.new_zeros(1))
        starts, ends = torch.nonzero(edges == 1).flatten(), torch.nonzero(edges == -1).flatten()
        return (ends - starts).tolist()

    def image_cost(self, rows: int) -> int:
        # the tiles behind `rows` (an estimate from the rows alone: unpadding drops some of them)
        return max(1, -(-rows // self.tokens_per_tile)) * self._tile_cost

    def select_images(self, sample: dict[str, Any], images: Sequence[int]) -> dict[str, Any]:
        pixels, counts = self._tiles_of(sample)
        starts = [0, *torch.tensor(counts).cumsum(0).tolist()]
        return {"pixel_values": torch.cat([pixels[starts[k]:starts[k + 1]] for k in images]),
                "image_sizes": sample["image_sizes"].reshape(-1, 2)[list(images)],
                "tiles": torch.tensor([counts[k] for k in images])}

    def split(self) -> dict[str, nn.Module]:
        return split_llava_onevision(self.model)

    def vision_modules(self) -> list[nn.Module]:
        return [self.model.model.vision_tower, self.model.model.multi_modal_projector]

    def vision_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        with_image = [s for s in samples if s.get("image_sizes") is not None]
        if not with_image:
            return {"pixel_values": torch.zeros(0, *self.image_shape), "image_sizes": torch.zeros(0, 2, dtype=torch.long),
                    "tiles": torch.zeros(0, dtype=torch.long)}
        parts = [self._tiles_of(s) for s in with_image]
        return {"pixel_values": torch.cat([p for p, _ in parts]),
                "image_sizes": torch.cat([s["image_sizes"].reshape(-1, 2) for s in with_image]),
                "tiles": torch.tensor([k for _, counts in parts for k in counts])}

    def check_sample(self, sample: dict[str, Any], index: int) -> None:
        super().check_sample(sample, index)
        sizes = sample.get("image_sizes")
        n = 0 if sizes is None else sizes.reshape(-1, 2).shape[0]
        runs = self.image_rows(sample)
        if len(runs) != n:
            raise ValueError(f"sample {index}: {len(runs)} runs of image placeholders (id {self.image_token_id}) but "
                             f"{n} image(s) in image_sizes; each image needs its own run (text between images)")
        if n:
            pixels, counts = self._tiles_of(sample)
            if pixels.shape[0] != sum(counts):
                raise ValueError(f"sample {index}: pixel_values hold {pixels.shape[0]} tiles but image_sizes "
                                 f"{sizes.reshape(-1, 2).tolist()} need {sum(counts)}")
