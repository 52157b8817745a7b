"""Qwen3.5 dense (`Qwen3_5ForConditionalGeneration`) split into two stages.

    vision   : patch embed + learned positions + blocks + merger (Qwen3-VL's tower without DeepStack)
               pixel_values [patches, D], grid_thw [n_img, 3] -> rows [sum_i t*h*w / merge^2, H_text]
    language : embeddings + a decoder of mixed layers + lm_head (LanguageStage): 3 of every 4 layers
               Gated DeltaNet (linear attention: a gated delta-rule recurrence over the sequence, with
               a short causal depthwise conv before it), the 4th full attention with an output gate

Packed rows (`language_batching` "packed"): the full-attention layers attend per sample
(models/per_sample_attention.py) and every Gated DeltaNet layer restarts its convolution and its
recurrence at every sample of a row (packed_deltanet.py), both from the row's `packed_segments`;
so packing takes the per-sample attention (sdpa or eager), the one path that hands the decoder
those segments ("row_mask" and a varlen attention kernel are refused by name).

Samples and M-RoPE positions as Qwen2-VL's (`get_rope_index` of the model, handed to the language
stage as `position_ids`). The decoder builds one mask per layer type (`layer_types`): a pipeline
chunk's config lists its own layers' types (pipeline_parallel/chunk.py `chunk_config`), and the
linear-attention layers keep no state between micro-batches in training (no cache), so a cut may
fall between any two layers, of either type.

On sequence shards (language cp > 1, sequence parallelism): the full-attention layers as every
decoder's (Ulysses over cp, context_parallel/attention.py, which lists the gated attention class), and
every Gated DeltaNet layer with its heads split over cp (sequence_shards.py: two all-to-alls per layer,
the convolution and the recurrence over whole sequences per head, nothing handed from rank to rank);
tp x cp must divide the linear-attention value heads (`check_heads`, by name). Sequence parallelism
alone needs nothing of this family: the layer's tp region gathers the whole sequence before it, and
the padding is at the end of every sequence (or a segment of its own in packed rows), where a causal
convolution and recurrence never reach a valid position, so the 2-D padding mask the layer takes
unsharded changes nothing a loss sees.
"""

from __future__ import annotations

import torch
from torch import nn

from ...models.language_stage import LanguageStage
from ...models.per_sample_attention import PER_SAMPLE
from ..qwen2_vl.adapter import Qwen2VLAdapter, Qwen2VLVisionStage, vision_token_ids
from .packed_deltanet import apply_segmented_deltanet
from .sequence_shards import apply_sequence_sharded_deltanet, check_heads


class Qwen3_5VisionStage(Qwen2VLVisionStage):
    """Qwen2-VL's stage over Qwen3.5's tower (Qwen3-VL's merger, no DeepStack levels)."""

    def input_dtype(self) -> torch.dtype:
        return self.visual.merger.linear_fc2.weight.dtype


def split_qwen3_5(model: nn.Module) -> dict[str, nn.Module]:
    language = LanguageStage(model.model.language_model, model.lm_head, vision_token_ids(model.config))
    return {"vision": Qwen3_5VisionStage(model), "language": language}


def linear_attention_layers(text_config) -> list[int]:
    return [i for i, t in enumerate(text_config.layer_types) if t == "linear_attention"]


class Qwen3_5Adapter(Qwen2VLAdapter):
    """Samples as for Qwen2-VL (images, clips, both or neither); a clip's temporal patches are
    separate placeholder runs, each after its timestamp, as in Qwen3-VL (families/qwen2_vl/video.py)."""
    FRAME_RUNS = True

    def separate_packed_samples(self, decoder: nn.Module) -> None:
        """Every Gated DeltaNet layer restarts its convolution and recurrence at each packed sample."""
        apply_segmented_deltanet(decoder)

    @staticmethod
    def tower_width(vision_config) -> tuple[int, int]:
        return vision_config.hidden_size, vision_config.intermediate_size

    def check_layouts(self, cfg) -> None:
        """Sequence shards: tp x cp must divide the Gated DeltaNet value heads (sequence_shards.py); and
        packed rows attended otherwise than per sample are refused (their segments would not reach those layers)."""
        from ...config import SECTION
        from ...errors import HeteroConfigError

        language = cfg.stages["language"]
        linear = linear_attention_layers(self.model.config.text_config)
        if linear:
            check_heads(self.model.config.text_config, language.tp, language.cp)
        mode = self.packed_attention(cfg.packed_attention) if cfg.packed else PER_SAMPLE
        if linear and mode != PER_SAMPLE:
            kernel = self.model.config.text_config._attn_implementation
            raise HeteroConfigError(
                f"{SECTION}.packed_attention",
                f"Qwen3.5 packs with per-sample attention only (here {mode!r}, "
                f"attention kernel {kernel!r}): its Gated DeltaNet layers restart at every sample of a packed row from "
                f"the row's sample lengths, which only the per-sample path hands to the decoder; load the model with "
                f"attn_implementation \"sdpa\" or \"eager\" and remove packed_attention, or use language_batching "
                f"\"samples\"")
        super().check_layouts(cfg)

    def shard(self, groups, cfg) -> None:
        """As every family; then on cp > 1 each Gated DeltaNet layer runs with its heads split over cp."""
        super().shard(groups, cfg)
        if groups["language"].is_member and cfg.stages["language"].cp > 1:
            self.split_linear_attention(self.model.get_decoder(), groups["language"].cp)

    def split_linear_attention(self, decoder: nn.Module, cp_group) -> None:
        """Every Gated DeltaNet layer of `decoder` on sequence shards over `cp_group` (sequence_shards.py)."""
        apply_sequence_sharded_deltanet(decoder, cp_group)

    def split(self) -> dict[str, nn.Module]:
        return split_qwen3_5(self.model)
