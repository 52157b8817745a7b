"""LLaVA (`LlavaForConditionalGeneration`, CLIP or SigLIP tower) split into two stages.

    vision   : vision tower + projector      pixel_values [n_img, C, H, W] -> rows [n_img * t, H_text]
    language : embeddings + LLM + lm_head    input_ids [b, s], rows -> logits [b, s, vocab]

The rows are the boundary tensor: one row per image placeholder token, in the order the
placeholders appear in the flattened `input_ids`. The stages share the parameters of the model
they were cut from (no copies), and together compute exactly the fused model's logits.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ...models.item_cost import transformer_cost
from ...models.adapter import StageAdapter
from ...models.language_stage import LanguageStage, empty_rows


class LlavaVisionStage(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        config = model.config
        self.vision_tower = model.model.vision_tower
        self.multi_modal_projector = model.model.multi_modal_projector
        self.feature_layer = config.vision_feature_layer
        self.select_strategy = config.vision_feature_select_strategy

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Boundary rows for a batch of images: [n_images * tokens_per_image, text hidden]."""
        if pixel_values.shape[0] == 0:  # a rank whose share of the batch has no image
            return empty_rows(self, {"pixel_values": pixel_values.new_zeros(1, *pixel_values.shape[1:])})
        pixel_values = pixel_values.to(self.multi_modal_projector.linear_2.weight.dtype)
        out = self.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
        layers = [self.feature_layer] if isinstance(self.feature_layer, int) else list(self.feature_layer)
        selected = [out.hidden_states[i] for i in layers]
        if self.select_strategy == "default":  # drop the CLS token, as LLaVA does
            selected = [h[:, 1:] for h in selected]
        features = self.multi_modal_projector(torch.cat(selected, dim=-1))
        return features.reshape(-1, features.shape[-1])

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters LLaVA's forward uses: the tower up to its deepest feature layer, the projector.

        Why: the layers after the feature layer, the tower's post-layernorm and SigLIP's pooling
        head never get a gradient. A single-process optimizer skips them; ZeRO would treat the
        missing gradient as zero and still apply weight decay. Leaving them out of the
        optimizer keeps both the same.
        """
        layers = self.vision_tower.encoder.layers
        wanted = [self.feature_layer] if isinstance(self.feature_layer, int) else list(self.feature_layer)
        deepest = max(k if k >= 0 else len(layers) + 1 + k for k in wanted)  # hidden_states[k]: after k layers
        unused = {id(p) for layer in layers[deepest:] for p in layer.parameters()}
        for name in ("post_layernorm", "head"):
            if hasattr(self.vision_tower, name):
                unused |= {id(p) for p in getattr(self.vision_tower, name).parameters()}
        return [p for p in self.parameters() if p.requires_grad and id(p) not in unused]


class LlavaLanguageStage(LanguageStage):
    def __init__(self, model: nn.Module):
        super().__init__(model.model.language_model, model.lm_head, model.config.image_token_id)


def split_llava(model: nn.Module) -> dict[str, nn.Module]:
    """{"vision": ..., "language": ...} stage modules sharing `model`'s parameters."""
    return {"vision": LlavaVisionStage(model), "language": LlavaLanguageStage(model)}


class LlavaAdapter(StageAdapter):
    """Samples carry `pixel_values` of shape [n, C, H, W] (n images, each `tokens_per_image`
    placeholders in order) or none (text only)."""

    # `stages.vision.freeze: ["tower"]` trains the projector alone (LLaVA's recipe); models/freeze.py
    FREEZE_GROUPS = {"vision": {"tower": ["model.vision_tower.*"], "projector": ["model.multi_modal_projector.*"]}}

    def __init__(self, model: nn.Module):
        self.model = model
        self.image_token_id = model.config.image_token_id
        self.pad_token_id = model.config.text_config.pad_token_id or 0
        v = model.config.vision_config
        # CLIP prepends a CLS token; the "default" strategy drops it, "full" keeps it.
        has_cls = v.model_type.startswith("clip")
        keeps_cls = has_cls and model.config.vision_feature_select_strategy == "full"
        self.tokens_per_image = (v.image_size // v.patch_size) ** 2 + int(keeps_cls)
        self.image_shape = (v.num_channels, v.image_size, v.image_size)
        # The tower attends over every patch (and CLIP's CLS token), whatever the projector keeps.
        encoder_len = (v.image_size // v.patch_size) ** 2 + int(has_cls)
        self._image_cost = transformer_cost(encoder_len, encoder_len, v.hidden_size, v.intermediate_size)

    def image_rows(self, sample: dict[str, Any]) -> list[int]:
        n = self.image_token_count(sample)
        if n % self.tokens_per_image:
            raise ValueError(f"{n} image placeholder tokens are not a whole number of images of "
                             f"{self.tokens_per_image} tokens")
        return [self.tokens_per_image] * (n // self.tokens_per_image)

    def image_cost(self, rows: int) -> int:
        return self._image_cost  # every image has the same size

    def select_images(self, sample: dict[str, Any], images: Sequence[int]) -> dict[str, Any]:
        pixels = sample["pixel_values"].reshape(-1, *self.image_shape)
        return {"pixel_values": pixels if len(images) == pixels.shape[0] else pixels[list(images)]}

    def split(self) -> dict[str, nn.Module]:
        return split_llava(self.model)

    def vision_modules(self) -> list[nn.Module]:
        return [self.model.model.vision_tower, self.model.model.multi_modal_projector]

    def vision_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        images = [s["pixel_values"].reshape(-1, *self.image_shape) for s in samples if s.get("pixel_values") is not None]
        if not images:
            return {"pixel_values": torch.zeros(0, *self.image_shape)}
        return {"pixel_values": torch.cat(images)}

    def check_sample(self, sample: dict[str, Any], index: int) -> None:
        super().check_sample(sample, index)
        n_images = 0 if sample.get("pixel_values") is None else sample["pixel_values"].reshape(-1, *self.image_shape).shape[0]
        expected = n_images * self.tokens_per_image
        found = self.image_token_count(sample)
        if found != expected:
            raise ValueError(
                f"sample {index}: {found} image placeholder tokens (id {self.image_token_id}) but "
                f"{n_images} image(s) x {self.tokens_per_image} tokens = {expected}"
            )
