"""Qwen3-VL (`Qwen3VLForConditionalGeneration`, dense) split into two stages, DeepStack included.

    vision   : patch embed + learned positions + blocks + merger, and one DeepStack merger per
               `deepstack_visual_indexes` block    pixel_values [patches, D], grid_thw [n_img, 3]
               -> rows [T, (1 + L) * H_text]: per image token the merged embedding, then each of
               the L DeepStack levels, concatenated on the hidden dim
    language : embeddings + decoder + lm_head; the merged embedding replaces the placeholders and
               DeepStack level l is added to the hidden states of the image tokens after decoder
               layer l (transformers' own `Qwen3VLTextModel` does the adding, given
               `visual_pos_masks` and `deepstack_visual_embeds`)

Why one concatenated tensor: the boundary exchanges row tensors `[T, width]` whose rows are
image tokens; every level has exactly the merged embedding's rows (one per image token, in the
same order) and the same destinations, so carrying them side by side moves each level's rows
at the lower bound with no change to the exchange, and its backward returns every level's
gradient along the same path. The language stage splits the width back into levels.

Sequence shards: a rank embeds its chunk of `input_ids` and receives the rows of that chunk
only; its decoder's hidden states are that same chunk, so `visual_pos_masks` is the chunk's own
placeholder mask and the levels' rows are the chunk's: DeepStack stays exact on every shard.
"""

from __future__ import annotations

import torch
from torch import nn

from ...models.item_cost import transformer_cost
from ..qwen2_vl.adapter import Qwen2VLAdapter, Qwen2VLVisionStage, vision_token_ids
from ...models.adapter import placeholder_mask
from ...models.language_stage import LanguageStage


class Qwen3VLVisionStage(Qwen2VLVisionStage):
    """Qwen2-VL's stage over Qwen3-VL's tower: its rows carry the DeepStack levels beside the merged
    embedding (Qwen3VLLanguageStage splits them)."""

    def input_dtype(self) -> torch.dtype:
        return self.visual.merger.linear_fc2.weight.dtype

    def encode(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        out = self.visual(pixel_values, grid_thw=image_grid_thw)
        return torch.cat([out.pooler_output, *out.deepstack_features], dim=-1)


class Qwen3VLLanguageStage(LanguageStage):
    """LanguageStage whose rows carry the merged embedding and the DeepStack levels side by side."""

    def __init__(self, model: nn.Module):
        super().__init__(model.model.language_model, model.lm_head, vision_token_ids(model.config))
        self.levels = len(model.config.vision_config.deepstack_visual_indexes)
        self.width = model.config.text_config.hidden_size

    def embed_inputs(self, input_ids, rows, n_placeholders=None):
        rows = rows if isinstance(rows, torch.Tensor) else rows[0]
        if rows.shape[-1] != (1 + self.levels) * self.width:
            raise ValueError(f"Qwen3-VL rows have width {rows.shape[-1]}, expected (1 + {self.levels} DeepStack "
                             f"levels) x {self.width}")
        merged, *levels = rows.split(self.width, dim=-1)
        embeds = self.embed(input_ids, merged, n_placeholders)
        # Level l is added after decoder layer l: with a pipeline, these layers must all be in the
        # first chunk (Qwen3VLAdapter.check_layouts refuses a cut that moves one out of it).
        return embeds, {
            # this rank's image and video positions: the levels' rows are theirs, in sequence order
            "visual_pos_masks": placeholder_mask(self.local_ids(input_ids), self.token_ids[0]),
            "deepstack_visual_embeds": [level.to(embeds.dtype) for level in levels] if levels else None,
        }


def split_qwen3_vl(model: nn.Module) -> dict[str, nn.Module]:
    return {"vision": Qwen3VLVisionStage(model), "language": Qwen3VLLanguageStage(model)}


class Qwen3VLAdapter(Qwen2VLAdapter):
    """Samples as for Qwen2-VL (images, clips, both or neither); a clip's temporal patches are
    separate placeholder runs, each after its timestamp (families/qwen2_vl/video.py)."""
    FRAME_RUNS = True

    @staticmethod
    def tower_width(vision_config) -> tuple[int, int]:
        return vision_config.hidden_size, vision_config.intermediate_size

    @property
    def hidden_size(self) -> int:
        """Width of a boundary row: the merged embedding and every DeepStack level."""
        levels = len(self.model.config.vision_config.deepstack_visual_indexes)
        return (1 + levels) * self.model.config.text_config.hidden_size

    def check_layouts(self, cfg) -> None:
        """With a pipelined language stage, the DeepStack levels reach the first pipeline stage only
        (they travel with the boundary rows): the decoder layers they are added after must all be in it."""
        from ...config import SECTION
        from ...pipeline_parallel.cut import layer_cut
        from ...errors import HeteroConfigError

        levels = len(self.model.config.vision_config.deepstack_visual_indexes)
        if cfg.language.pp > 1 and levels:
            first = layer_cut(self.model.config.text_config.num_hidden_layers, cfg.language.pp, cfg.pp_layers)[0]
            if len(first) < levels:
                raise HeteroConfigError(
                    f"{SECTION}.stages.language.pp_layers",
                    f"Qwen3-VL adds its {levels} DeepStack levels to the hidden states after decoder layers "
                    f"0-{levels - 1}, and only the first pipeline stage receives them, but it holds {len(first)} "
                    f"layer(s); give the first pipeline stage at least {levels} layers (pp_layers[0] >= {levels})")
        super().check_layouts(cfg)

    def image_cost(self, rows: int) -> int:
        patches = rows * self.merge**2  # every block attends over the image's patches
        return transformer_cost(patches, patches, *self._vision_width)

    def split(self) -> dict[str, nn.Module]:
        return split_qwen3_vl(self.model)
