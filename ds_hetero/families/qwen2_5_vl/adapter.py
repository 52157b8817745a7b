"""Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`) split into two stages.

    vision   : patch embed + windowed / full-attention blocks + merger
               pixel_values [patches, D], grid_thw [n_img, 3] -> rows [sum_i t*h*w / merge^2, H_text]
    language : embeddings + decoder + lm_head (LanguageStage), M-RoPE positions from the full batch

What differs from Qwen2-VL: the tower attends inside windows of `window_size` pixels except in
the `fullatt_block_indexes` blocks, which attend over the whole image. Transformers' tower
computes the window order and both `cu_seqlens` from the `grid_thw` it is given, per image; the
vision stage hands it exactly the images this encoder rank holds after balancing, so every
window and every full-attention span is one image's, as in the fused model (an image is never
split over encoder ranks). The merged rows come back in image order (the tower undoes its
window permutation), and the M-RoPE positions are computed by the model's own `get_rope_index`
on the language stage's full batch, so they are global.
"""

from __future__ import annotations

from torch import nn

from ...models.item_cost import transformer_cost
from ..qwen2_vl.adapter import Qwen2VLAdapter, split_qwen2_vl


def split_qwen2_5_vl(model: nn.Module) -> dict[str, nn.Module]:
    return split_qwen2_vl(model)  # the same cut: the tower's windows are its own business


def window_patches(vision_config) -> int:
    """Patches of one attention window (the tower's `vit_merger_window_size` merged tokens a side)."""
    side = vision_config.window_size // vision_config.spatial_merge_size // vision_config.patch_size
    return (side * vision_config.spatial_merge_size) ** 2


class Qwen2_5_VLAdapter(Qwen2VLAdapter):
    """Samples as for Qwen2-VL (images, clips, both or neither), each clip with its seconds per
    temporal patch in `second_per_grid_ts` [n_clips] (the processor's field; the time-aware temporal
    positions space a clip's temporal patches by tokens_per_second x that)."""
    SAMPLE_FIELDS = Qwen2VLAdapter.SAMPLE_FIELDS + ("second_per_grid_ts",)
    SECONDS_FIELD = "second_per_grid_ts"

    def __init__(self, model: nn.Module):
        super().__init__(model)
        v = model.config.vision_config
        self._window = window_patches(v)
        self._full_blocks = len(set(v.fullatt_block_indexes) & set(range(v.depth)))
        self._window_blocks = v.depth - self._full_blocks

    @staticmethod
    def tower_width(vision_config) -> tuple[int, int]:
        return vision_config.hidden_size, vision_config.intermediate_size

    def attention_cost(self, rows: int, attended: int) -> int:
        # Full-attention blocks attend over the frame's patches, windowed ones over at most one
        # window (a window at the frame's edge is smaller; the bound keeps the cost a function of
        # the row count alone, which is all every rank knows of a light sample).
        patches = rows * self.merge**2
        full = transformer_cost(patches, attended, *self._vision_width)
        windowed = transformer_cost(patches, min(attended, self._window), *self._vision_width)
        return self._full_blocks * full + self._window_blocks * windowed

    def split(self) -> dict[str, nn.Module]:
        return split_qwen2_5_vl(self.model)
