"""InternVL (`InternVLForConditionalGeneration`: InternViT + pixel shuffle + MLP projector) in two stages.

    vision   : InternViT tower + pixel shuffle + projector    pixel_values [n_tiles, C, H, W]
               -> rows [n_tiles * image_seq_length, H_text]
    language : embeddings + decoder + lm_head (LanguageStage)

Dynamic tiles: the processor cuts an image into a variable number of tiles (plus a thumbnail),
each tile `image_seq_length` placeholders, all of one image in one run between <img> and
</img>; `pixel_values` holds every tile of the sample in order. An item of the encoder is an
image (its run): rows = tiles x image_seq_length. The tower attends within each tile over its
(size / patch)^2 patches plus a CLS token; pixel shuffle then folds each 1/downsample_ratio^2
block of patches into one token, so the encoder's work is per patch and the boundary's per
shuffled token (the cost model and the planner see both).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ...models.item_cost import transformer_cost
from ...models.adapter import StageAdapter
from ...models.language_stage import LanguageStage, empty_rows


class InternVLVisionStage(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        config = model.config
        self.vision_tower = model.model.vision_tower
        self.multi_modal_projector = model.model.multi_modal_projector
        self.pixel_shuffle = model.model.pixel_shuffle  # a pure reshape: no parameters
        self.feature_layer = config.vision_feature_layer
        self.select_strategy = config.vision_feature_select_strategy
        self.downsample_ratio = config.downsample_ratio

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """What InternVLModel.get_image_features computes, flattened to boundary rows."""
        if pixel_values.shape[0] == 0:
            return empty_rows(self, {"pixel_values": pixel_values.new_zeros(1, *pixel_values.shape[1:])})
        pixel_values = pixel_values.to(self.multi_modal_projector.linear_2.weight.dtype)
        out = self.vision_tower(pixel_values=pixel_values, return_dict=True,
                                output_hidden_states=self.feature_layer != -1)
        features = out.last_hidden_state if self.feature_layer == -1 else out.hidden_states[self.feature_layer]
        if self.select_strategy == "default":  # drop the CLS token
            features = features[:, 1:, :]
        n, tokens = features.shape[0], features.shape[1]
        side = int(tokens**0.5)
        features = self.pixel_shuffle(features.reshape(n, side, side, -1), scale_factor=self.downsample_ratio)
        features = self.multi_modal_projector(features.reshape(n, -1, features.shape[-1]))
        return features.reshape(-1, features.shape[-1])

    def trainable_parameters(self) -> list[nn.Parameter]:
        """With an earlier feature layer, the layers after it (and the tower's final norm) get no
        gradient: left out of the optimizer, as for LLaVA (families/llava/adapter.py says why)."""
        if self.feature_layer == -1:
            return [p for p in self.parameters() if p.requires_grad]
        layers = self.vision_tower.encoder.layer
        deepest = self.feature_layer if self.feature_layer >= 0 else len(layers) + 1 + self.feature_layer
        unused = {id(p) for layer in layers[deepest:] for p in layer.parameters()}
        unused |= {id(p) for p in self.vision_tower.layernorm.parameters()}
        return [p for p in self.parameters() if p.requires_grad and id(p) not in unused]


def split_internvl(model: nn.Module) -> dict[str, nn.Module]:
    language = LanguageStage(model.model.language_model, model.lm_head, model.config.image_token_id)
    return {"vision": InternVLVisionStage(model), "language": language}


class InternVLAdapter(StageAdapter):
    """Samples carry `pixel_values` [n_tiles, C, H, W] (every tile of every image, in order; each
    image one run of placeholders, image_seq_length per tile) or none (text only)."""

    def __init__(self, model: nn.Module):
        self.model = model
        cfg = model.config
        self.image_token_id = cfg.image_token_id
        self.pad_token_id = cfg.text_config.pad_token_id or 0
        v = cfg.vision_config
        size, patch = v.image_size, v.patch_size
        size, patch = (size if isinstance(size, int) else size[0]), (patch if isinstance(patch, int) else patch[0])
        self.tokens_per_tile = cfg.image_seq_length
        self.image_shape = (v.num_channels, size, size)
        patches = (size // patch) ** 2 + 1  # the tower attends over every patch and its CLS token
        self._tile_cost = transformer_cost(patches, patches, v.hidden_size, v.intermediate_size)

    def image_rows(self, sample: dict[str, Any]) -> list[int]:
        """Each image is one run of placeholders (the processor wraps it in <img> ... </img>)."""
        ids = sample["input_ids"].reshape(-1)
        is_image = (ids == self.image_token_id).int()
        edges = torch.diff(is_image, prepend=is_image.new_zeros(1), append=is_image.new_zeros(1))
        starts, ends = torch.nonzero(edges == 1).flatten(), torch.nonzero(edges == -1).flatten()
        runs = (ends - starts).tolist()
        if any(r % self.tokens_per_tile for r in runs):
            raise ValueError(f"image placeholder runs {runs} are not whole numbers of tiles of "
                             f"{self.tokens_per_tile} tokens")
        return runs

    def image_cost(self, rows: int) -> int:
        return (rows // self.tokens_per_tile) * self._tile_cost  # tiles are encoded independently

    def select_images(self, sample: dict[str, Any], images: Sequence[int]) -> dict[str, Any]:
        tiles = [r // self.tokens_per_tile for r in self.image_rows(sample)]
        pixels = sample["pixel_values"].reshape(-1, *self.image_shape)
        if len(images) == len(tiles):
            return {"pixel_values": pixels}
        starts = [0, *torch.tensor(tiles).cumsum(0).tolist()]
        return {"pixel_values": torch.cat([pixels[starts[k]:starts[k + 1]] for k in images])}

    def split(self) -> dict[str, nn.Module]:
        return split_internvl(self.model)

    def vision_modules(self) -> list[nn.Module]:
        return [self.model.model.vision_tower, self.model.model.multi_modal_projector]

    def vision_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        tiles = [s["pixel_values"].reshape(-1, *self.image_shape) for s in samples if s.get("pixel_values") is not None]
        return {"pixel_values": torch.cat(tiles) if tiles else torch.zeros(0, *self.image_shape)}

    def check_layouts(self, cfg) -> None:
        from ...config import SECTION
        from ...errors import HeteroConfigError

        if cfg.stages["vision"].tp > 1 and self.model.config.vision_config.use_qk_norm:
            raise HeteroConfigError(
                f"{SECTION}.stages.vision.tp", "this InternViT normalises q and k over all heads together "
                "(use_qk_norm), which a head-sharded tower cannot do without an extra reduction; use vision tp 1")
        super().check_layouts(cfg)

    def check_sample(self, sample: dict[str, Any], index: int) -> None:
        super().check_sample(sample, index)
        pixels = sample.get("pixel_values")
        n_tiles = 0 if pixels is None else pixels.reshape(-1, *self.image_shape).shape[0]
        rows = self.image_rows(sample)
        if sum(rows) != n_tiles * self.tokens_per_tile:
            raise ValueError(
                f"sample {index}: {sum(rows)} image placeholder tokens (id {self.image_token_id}) but "
                f"{n_tiles} tile(s) x {self.tokens_per_tile} tokens = {n_tiles * self.tokens_per_tile}")
