"""LLaVA (`LlavaForConditionalGeneration`, CLIP or SigLIP tower) split into two stages.

    vision   : vision tower + projector      pixel_values [n_img, C, H, W] -> rows [n_img * t, H_text]
    language : embeddings + LLM + lm_head    input_ids [b, s], rows -> logits [b, s, vocab]

The rows are the boundary tensor: one row per image placeholder token, in the order the
placeholders appear in the flattened `input_ids`. The stages share the parameters of the model
they were cut from (no copies), and together compute exactly the fused model's logits.
"""

from __future__ import annotations

import torch
from torch import nn


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
            return self._empty_rows(pixel_values)
        pixel_values = pixel_values.to(next(self.vision_tower.parameters()).dtype)
        out = self.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
        layers = [self.feature_layer] if isinstance(self.feature_layer, int) else list(self.feature_layer)
        selected = [out.hidden_states[i] for i in layers]
        if self.select_strategy == "default":  # drop the CLS token, as LLaVA does
            selected = [h[:, 1:] for h in selected]
        features = self.multi_modal_projector(torch.cat(selected, dim=-1))
        return features.reshape(-1, features.shape[-1])

    def _empty_rows(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # Keep the projector in the graph so every rank's backward touches the same parameters.
        width = self.multi_modal_projector.linear_2.out_features
        weight = self.multi_modal_projector.linear_2.weight
        return weight.new_zeros(0, width) + 0 * weight.sum()


class LlavaLanguageStage(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.language_model = model.model.language_model
        self.lm_head = model.lm_head
        self.image_token_id = model.config.image_token_id

    def forward(
        self,
        input_ids: torch.Tensor,
        image_rows: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        embeds = self.language_model.get_input_embeddings()(input_ids)
        placeholder = input_ids == self.image_token_id
        n_placeholders = int(placeholder.sum())
        if n_placeholders != image_rows.shape[0]:
            raise ValueError(
                f"input_ids hold {n_placeholders} image placeholder tokens (id {self.image_token_id}) "
                f"but {image_rows.shape[0]} image rows arrived"
            )
        # Out of place: the rows keep their own autograd path back to the vision stage.
        embeds = embeds.masked_scatter(placeholder.unsqueeze(-1), image_rows.to(embeds.dtype))
        hidden = self.language_model(
            inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        return self.lm_head(hidden)


def split_llava(model: nn.Module) -> dict[str, nn.Module]:
    """{"vision": ..., "language": ...} stage modules sharing `model`'s parameters."""
    return {"vision": LlavaVisionStage(model), "language": LlavaLanguageStage(model)}
