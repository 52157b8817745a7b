"""Gemma 3 (`Gemma3ForConditionalGeneration`, SigLIP tower) split into two stages.

    vision   : SigLIP tower + projector (average pooling to `mm_tokens_per_image`, RMSNorm, projection)
               pixel_values [n_img, C, H, W] -> rows [n_img * mm_tokens_per_image, H_text]
    language : scaled embeddings + decoder + lm_head    input_ids [b, s], rows -> logits

The pooling belongs to the encoder stage: the tower's work is per patch ((image / patch)^2 per
image), the boundary's per pooled token. The decoder's mask is not plain causal: image tokens
of one image attend to each other bidirectionally (the block of consecutive image placeholders),
inside causal attention, and the sliding-window layers intersect that with their window. The
language stage builds exactly the masks Gemma3Model builds, with transformers' own
`create_masks_for_vision_model`, from the full `input_ids` of its micro-batch (the processor's
`token_type_ids` are 1 exactly at the image placeholders, so they are recomputed from them).

Packed rows (`language_batching` "packed") attend per sample (models/per_sample_attention.py), each
sample under the masks `decoder_mask` builds for it alone (models/sample_masks.py: its image blocks,
its sliding windows, never another sample's tokens); a packed row scored whole ("row_mask") or by a
varlen kernel (flash-attention, flex) is refused, as those would not carry the image blocks per sample.

Context parallelism and sequence parallelism are refused: a sequence shard would need the
blockwise and sliding-window mask of the full sequence, which the Ulysses path here does not
build.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ...models.item_cost import transformer_cost
from ...models.adapter import StageAdapter
from ...models.language_stage import LanguageStage, empty_rows
from ...models.per_sample_attention import require_per_sample

# why packed Gemma rows attend per sample only (check_layouts; Gemma 4 says the same)
PER_SAMPLE_WHY = ("its image tokens attend to each other both ways and its sliding-window layers see a window, "
                  "each inside its own sample, from masks built per sample, which only the per-sample path "
                  "hands to the decoder")


class Gemma3VisionStage(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.vision_tower = model.model.vision_tower
        self.multi_modal_projector = model.model.multi_modal_projector

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.shape[0] == 0:  # a rank whose share of the batch has no image
            return empty_rows(self, {"pixel_values": pixel_values.new_zeros(1, *pixel_values.shape[1:])})
        pixel_values = pixel_values.to(self.multi_modal_projector.mm_input_projection_weight.dtype)
        hidden = self.vision_tower(pixel_values=pixel_values, return_dict=True).last_hidden_state
        features = self.multi_modal_projector(hidden)
        return features.reshape(-1, features.shape[-1])


class Gemma3LanguageStage(LanguageStage):
    """LanguageStage with Gemma 3's masks: causal, image blocks bidirectional, sliding windows."""

    OWN_SAMPLE_MASKS = True  # packed: each sample's image blocks and windows, built by decoder_mask alone

    def __init__(self, model: nn.Module):
        super().__init__(model.model.language_model, model.lm_head, model.config.image_token_id)
        self.vocab_size = model.config.text_config.vocab_size

    def embedding_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.token_ids[0] < self.vocab_size:
            return input_ids
        return input_ids.masked_fill(input_ids == self.token_ids[0], 0)  # as Gemma3Model does

    def decoder_mask(self, input_ids, hidden, attention_mask, position_ids):
        from transformers.models.gemma3.modeling_gemma3 import (create_masks_for_vision_model,
                                                                get_block_sequence_ids_for_mask)

        token_type_ids = (input_ids == self.token_ids[0]).long()
        return create_masks_for_vision_model(
            config=self.language_model.config, inputs_embeds=hidden, attention_mask=attention_mask,
            past_key_values=None, position_ids=position_ids,
            block_sequence_ids=get_block_sequence_ids_for_mask(token_type_ids, device=hidden.device))


def split_gemma3(model: nn.Module) -> dict[str, nn.Module]:
    return {"vision": Gemma3VisionStage(model), "language": Gemma3LanguageStage(model)}


class Gemma3Adapter(StageAdapter):
    """Samples carry `pixel_values` [n, C, H, W] (n images, each `mm_tokens_per_image` placeholders,
    the processor puts begin/end-of-image tokens around each) or none (text only)."""

    def __init__(self, model: nn.Module):
        self.model = model
        cfg = model.config
        self.image_token_id = cfg.image_token_id
        self.pad_token_id = cfg.text_config.pad_token_id or 0
        v = cfg.vision_config
        self.tokens_per_image = cfg.mm_tokens_per_image
        self.image_shape = (v.num_channels, v.image_size, v.image_size)
        patches = (v.image_size // v.patch_size) ** 2  # the tower attends over every patch
        self._image_cost = transformer_cost(patches, patches, v.hidden_size, v.intermediate_size)

    def image_rows(self, sample: dict[str, Any]) -> list[int]:
        n = self.image_token_count(sample)
        if n % self.tokens_per_image:
            raise ValueError(f"{n} image placeholder tokens are not a whole number of images of "
                             f"{self.tokens_per_image} tokens")
        return [self.tokens_per_image] * (n // self.tokens_per_image)

    def image_cost(self, rows: int) -> int:
        return self._image_cost  # every image is pooled from the same patch grid

    def select_images(self, sample: dict[str, Any], images: Sequence[int]) -> dict[str, Any]:
        pixels = sample["pixel_values"].reshape(-1, *self.image_shape)
        return {"pixel_values": pixels if len(images) == pixels.shape[0] else pixels[list(images)]}

    def split(self) -> dict[str, nn.Module]:
        return split_gemma3(self.model)

    def vision_modules(self) -> list[nn.Module]:
        # The projector is a bare weight matrix after pooling: replicated over the vision tp group.
        return [self.model.model.vision_tower]

    def vision_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        images = [s["pixel_values"].reshape(-1, *self.image_shape) for s in samples if s.get("pixel_values") is not None]
        if not images:
            return {"pixel_values": torch.zeros(0, *self.image_shape)}
        return {"pixel_values": torch.cat(images)}

    def check_layouts(self, cfg) -> None:
        from ...config import SECTION
        from ...context_parallel import is_sharded
        from ...errors import HeteroConfigError

        language = cfg.stages["language"]
        if is_sharded(language):
            raise HeteroConfigError(
                f"{SECTION}.stages.language",
                "Gemma 3 cannot cut its sequences (cp > 1 or sequence_parallel): its image tokens attend "
                "bidirectionally within each image and its sliding-window layers need their own mask, which "
                "sequence shards do not build; use cp 1 without sequence_parallel")
        if cfg.packed:
            require_per_sample(self.packed_attention(cfg.packed_attention),
                               self.model.config.text_config._attn_implementation, "Gemma 3", PER_SAMPLE_WHY)
        super().check_layouts(cfg)

    def check_sample(self, sample: dict[str, Any], index: int) -> None:
        super().check_sample(sample, index)
        pixels = sample.get("pixel_values")
        n_images = 0 if pixels is None else pixels.reshape(-1, *self.image_shape).shape[0]
        found = self.image_token_count(sample)
        if found != n_images * self.tokens_per_image:
            raise ValueError(
                f"sample {index}: {found} image placeholder tokens (id {self.image_token_id}) but "
                f"{n_images} image(s) x {self.tokens_per_image} tokens = {n_images * self.tokens_per_image}")
