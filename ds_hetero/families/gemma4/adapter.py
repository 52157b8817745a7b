"""Gemma 4 (`Gemma4ForConditionalGeneration`) split into three stages.

    vision   : patch embedder + vision encoder + pooler (k x k average by patch position, padding
               stripped, standardised) + `embed_vision` (norm, projection)
               pixel_values [n, P, 3 p^2], image_position_ids [n, P, 2] -> rows [soft tokens, H_text]
    audio    : subsampling convs + conformer layers + output projection + `embed_audio`, padding stripped
               input_features [n, F, n_mel], input_features_mask [n, F] -> rows [soft tokens, H_text]
    language : embeddings (placeholders looked up as padding, as Gemma4Model does) + per-layer
               embeddings + decoder + lm_head + the final logit softcap

The decoder, as Gemma4Model runs it:
- per-layer embeddings (`hidden_size_per_layer_input`): a second embedding table looked up at the
  ids (multimodal placeholders as padding), combined inside the decoder with a projection of the
  merged embeddings (rows included); the language stage hands the lookup to the decoder as
  `per_layer_inputs`, so the decoder combines them exactly as the fused model does;
- masks: with `use_bidirectional_attention == "vision"` the sliding-window layers let the tokens of one
  image attend to each other both ways (inside their window), the full layers stay causal
  (`create_masks_for_vision_model`, from the micro-batch's full `input_ids`); otherwise causal and
  sliding masks from the padding mask;
- layers that reuse an earlier layer's keys and values (`num_kv_shared_layers`) and layers whose values
  are their keys (`attention_k_eq_v`) run as HF wrote them; over tp each rank's shared keys and values
  are its own heads' (plans.py);
- the MoE block (`enable_moe_block`): router and experts next to the dense MLP in each layer; its
  experts are sharded over `stages.language.ep` by the expert-parallel axis (expert_parallel/), the
  block's own call (`experts(hidden, top_k_index, top_k_weights)`) and fused layout ([E, 2I, H],
  [E, H, I]) being what it serves. Gemma 4 adds no load-balancing loss.

Pipelined (pp > 1): the per-layer inputs (the later layers' slices) and, where a cut falls between a
storing and a reusing layer, the shared keys and values travel with the hidden states
(pipeline_carry.py); the softcap is applied by the last chunk (`final_logits`).

Refused, each with a HeteroConfigError naming the field (check_layouts): cp and sequence parallelism
(the image blocks and sliding windows need the full sequence's masks), `use_bidirectional_attention:
"all"` (a non-causal decoder); and packed rows attended otherwise than per sample. Videos (`pixel_values_videos`) are refused by check_sample.

Packed rows attend per sample (models/per_sample_attention.py), each sample under the masks
`decoder_mask` builds for it alone (models/sample_masks.py); the per-layer embeddings are looked up
and projected per token, as unpacked, so packing leaves them each token's own.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ...models.adapter import EncoderPort, StageAdapter, placeholder_mask
from ...models.item_cost import transformer_cost
from ...models.language_stage import LanguageStage, empty_rows
from ...models.per_sample_attention import require_per_sample
from ..gemma3.adapter import PER_SAMPLE_WHY
from ..qwen2_5_omni.adapter import placeholder_runs
from .pipeline_carry import Gemma4Carry
from .media import audio_fields, batch_audio, batch_images, check_media, image_fields


class Gemma4VisionStage(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.vision_tower = model.model.vision_tower
        self.embed_vision = model.model.embed_vision
        self.k = model.config.vision_config.pooling_kernel_size

    def forward(self, pixel_values: torch.Tensor, image_position_ids: torch.Tensor) -> torch.Tensor:
        if pixel_values.shape[0] == 0:  # a rank whose share of the batch has no image: one kernel's patches
            k = self.k
            grid = torch.tensor([[x, y] for y in range(k) for x in range(k)], dtype=image_position_ids.dtype)
            return empty_rows(self, {"pixel_values": pixel_values.new_zeros(1, k * k, pixel_values.shape[-1]),
                                     "image_position_ids": grid.unsqueeze(0)})
        hidden = self.vision_tower(pixel_values=pixel_values, pixel_position_ids=image_position_ids).last_hidden_state
        return self.embed_vision(inputs_embeds=hidden)


class Gemma4AudioStage(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.audio_tower = model.model.audio_tower
        self.embed_audio = model.model.embed_audio

    def forward(self, input_features: torch.Tensor, input_features_mask: torch.Tensor) -> torch.Tensor:
        if input_features.shape[0] == 0:  # no clip here: four frames of silence, times zero
            return empty_rows(self, {"input_features": input_features.new_zeros(1, 4, input_features.shape[-1]),
                                     "input_features_mask": input_features_mask.new_ones(1, 4)})
        dtype = self.embed_audio.embedding_projection.weight.dtype
        out = self.audio_tower(input_features.to(dtype), input_features_mask.bool())
        return self.embed_audio(inputs_embeds=out.last_hidden_state)[out.attention_mask]


class Gemma4LanguageStage(LanguageStage):
    """LanguageStage with Gemma 4's per-layer embeddings, masks and final logit softcap."""

    OWN_SAMPLE_MASKS = True  # packed: each sample's image blocks and windows, built by decoder_mask alone

    def __init__(self, model: nn.Module, token_ids: Sequence[int]):
        super().__init__(model.model.language_model, model.lm_head, tuple(token_ids))
        cfg = model.config
        self.text_config = cfg.text_config
        self.image_token_id = cfg.image_token_id
        self.multimodal_ids = (cfg.image_token_id, cfg.video_token_id, cfg.audio_token_id)
        self.pad_id = cfg.text_config.pad_token_id or 0
        self.pipeline_carry = Gemma4Carry(self.language_model)  # reads the kv heads when a chunk is cut

    def final_logits(self, logits: torch.Tensor) -> torch.Tensor:
        cap = self.text_config.final_logit_softcapping
        if cap is not None:  # elementwise: the same on a vocabulary shard of the logits
            logits = torch.tanh(logits / cap) * cap
        return logits

    # pipelined (pp > 1): the per-layer inputs and the shared keys and values travel with the hidden
    # states (pipeline_carry.py)
    def chunk_decoder(self, decoder, layers, first):
        self.pipeline_carry.adjust(decoder, first)

    def carried_width(self, start):
        return self.pipeline_carry.width(start)

    def chunk_inputs(self, embeds, extra, carried, layers, first):
        return self.pipeline_carry.inputs(embeds, extra, carried, layers, first)

    def chunk_carry(self, state, layers):
        return self.pipeline_carry.carry(state, layers)

    def embedding_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Multimodal placeholders looked up as padding (Gemma4Model's `llm_input_ids`): their rows are
        replaced, but the per-layer embeddings read these ids."""
        return input_ids.masked_fill(placeholder_mask(input_ids, self.multimodal_ids), self.pad_id)

    def embed_inputs(self, input_ids, rows, n_placeholders=None):
        embeds = self.embed(input_ids, rows, n_placeholders)
        if not self.text_config.hidden_size_per_layer_input:
            return embeds, {}
        per_layer = self.language_model.get_per_layer_inputs(self.embedding_ids(input_ids), None)
        return embeds, {"per_layer_inputs": per_layer}

    def decoder_mask(self, input_ids, hidden, attention_mask, position_ids):
        if self.text_config.use_bidirectional_attention != "vision":
            return attention_mask  # the decoder builds its causal and sliding masks from it
        from transformers.models.gemma4.modeling_gemma4 import (create_masks_for_vision_model,
                                                                get_block_sequence_ids_for_mask)

        if position_ids is None:  # as Gemma4Model counts them
            position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        blocks = get_block_sequence_ids_for_mask((input_ids == self.image_token_id).long(), device=hidden.device)
        return create_masks_for_vision_model(config=self.text_config, inputs_embeds=hidden,
                                             attention_mask=attention_mask, past_key_values=None,
                                             position_ids=position_ids, block_sequence_ids=blocks)


class Gemma4Adapter(StageAdapter):
    """Samples carry Gemma4Processor's fields (media.py): `pixel_values` + `image_position_ids` for
    images, `input_features` + `input_features_mask` for audio clips, either, both or neither. A
    model without an audio tower (`audio_config` None) has the vision stage only."""

    ENCODER_STAGES = ("vision", "audio")
    SAMPLE_FIELDS = ("pixel_values", "image_position_ids", "input_features", "input_features_mask")

    def __init__(self, model: nn.Module):
        self.model = model
        cfg = model.config
        self.image_token_id, self.audio_token_id, self.video_token_id = (
            cfg.image_token_id, cfg.audio_token_id, cfg.video_token_id)
        self.pad_token_id = cfg.text_config.pad_token_id or 0
        v, a = cfg.vision_config, cfg.audio_config
        self.k = v.pooling_kernel_size
        self.patch_dim = 3 * v.patch_size**2
        self._vision_width = (v.hidden_size, v.intermediate_size)
        self.has_audio = a is not None
        self.ENCODER_STAGES = ("vision", "audio") if self.has_audio else ("vision",)
        if self.has_audio:
            self.n_mel = a.subsampling_conv_channels[0]
            self._audio_width = (a.hidden_size, 8 * a.hidden_size)  # two feed-forwards of 4 h
            self._audio_span = a.attention_chunk_size + a.attention_context_left - 1 + a.attention_context_right

    def encoders(self) -> dict[str, EncoderPort]:
        ports = getattr(self, "_ports", None)
        if ports is None:
            ports = {"vision": EncoderPort("vision", self.image_token_id, self.image_rows, self.image_cost,
                                           self.select_images, self.vision_inputs)}
            if self.has_audio:
                ports["audio"] = EncoderPort("audio", self.audio_token_id, self.audio_rows, self.audio_cost,
                                             self.select_audios, self.audio_inputs)
            self._ports = ports
        return ports

    def split(self) -> dict[str, nn.Module]:
        stages = {"vision": Gemma4VisionStage(self.model)}
        if self.has_audio:
            stages["audio"] = Gemma4AudioStage(self.model)
        stages["language"] = Gemma4LanguageStage(self.model, tuple(p.token_id for p in self.encoders().values()))
        return stages

    def vision_modules(self) -> list[nn.Module]:
        # embed_vision (a norm without weight and one projection) stays replicated over the vision tp group
        return [self.model.model.vision_tower]

    def encoder_modules(self) -> dict[str, list[nn.Module]]:
        modules = {"vision": self.vision_modules()}
        if self.has_audio:
            modules["audio"] = [self.model.model.audio_tower]
        return modules

    # ------------------------------------------------------------------ images
    def image_rows(self, sample: dict[str, Any]) -> list[int]:
        return placeholder_runs(sample["input_ids"], self.image_token_id)

    def image_cost(self, rows: int) -> int:
        patches = rows * self.k**2  # the tower attends over every real patch of the image
        return transformer_cost(patches, patches, *self._vision_width)

    def select_images(self, sample: dict[str, Any], images: Sequence[int]) -> dict[str, Any]:
        pixels, positions = image_fields(sample)
        if len(images) == pixels.shape[0]:
            return {"pixel_values": pixels, "image_position_ids": positions}
        return {"pixel_values": pixels[list(images)], "image_position_ids": positions[list(images)]}

    def vision_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return batch_images(samples, self.k, self.patch_dim)

    # ------------------------------------------------------------------ audio
    def audio_rows(self, sample: dict[str, Any]) -> list[int]:
        return placeholder_runs(sample["input_ids"], self.audio_token_id)

    def audio_cost(self, rows: int) -> int:
        # the conformer runs at the soft-token rate, attending within a chunk and its left context
        return transformer_cost(rows, min(rows, self._audio_span), *self._audio_width)

    def select_audios(self, sample: dict[str, Any], clips: Sequence[int]) -> dict[str, Any]:
        features, mask = audio_fields(sample)
        return {"input_features": features[list(clips)], "input_features_mask": mask[list(clips)]}

    def audio_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return batch_audio(samples, self.n_mel)

    # ------------------------------------------------------------------ checks and sharding
    def check_layouts(self, cfg) -> None:
        from ...config import SECTION
        from ...context_parallel import is_sharded
        from ...errors import HeteroConfigError

        language, field = cfg.stages["language"], f"{SECTION}.stages.language"
        if is_sharded(language):
            raise HeteroConfigError(
                field + (".cp" if language.cp > 1 else ".sequence_parallel"),
                "Gemma 4 cannot cut its sequences (cp > 1 or sequence_parallel): its image tokens attend "
                "bidirectionally within each image on the sliding-window layers, whose masks a sequence shard "
                "does not build; use cp 1 without sequence_parallel")
        if self.model.config.text_config.use_bidirectional_attention == "all":
            raise HeteroConfigError(
                f"{field}", "text_config.use_bidirectional_attention is \"all\" (every token attends both ways: "
                "not a causal language model to fine-tune with next-token labels); use \"vision\" or None")
        if cfg.packed:
            require_per_sample(self.packed_attention(cfg.packed_attention),
                               self.model.config.text_config._attn_implementation, "Gemma 4", PER_SAMPLE_WHY)
        super().check_layouts(cfg)

    def shard(self, groups, cfg) -> None:
        from ...expert_parallel import apply_expert_parallel

        super().shard(groups, cfg)  # attention and the dense MLP over tp
        language = groups["language"]
        if language.is_member and cfg.stages["language"].ep > 1:
            apply_expert_parallel(self.model.get_decoder(), language)

    def check_sample(self, sample: dict[str, Any], index: int) -> None:
        super().check_sample(sample, index)
        videos = int((sample["input_ids"] == self.video_token_id).sum())
        if videos:
            raise ValueError(f"sample {index}: {videos} video placeholder token(s) (id {self.video_token_id}); "
                             "Gemma 4's videos are not supported here, give their frames as images")
        audio_runs = self.audio_rows(sample) if self.has_audio else []
        if not self.has_audio and (sample.get("input_features") is not None or
                                   int((sample["input_ids"] == self.audio_token_id).sum())):
            raise ValueError(f"sample {index}: audio given, but {type(self.model).__name__} has no audio tower "
                             "(audio_config is None)")
        check_media(sample, index, self.k, getattr(self, "n_mel", 0), self.image_rows(sample), audio_runs)
