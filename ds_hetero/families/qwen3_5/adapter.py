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

Refused: a language stage that cuts its sequences. Under cp each rank would hold a piece of the
sequence, and a Gated DeltaNet layer's output at a position depends on the recurrent state (and the
conv window) carried from every earlier position: the state would have to pass from cp rank to cp
rank in order, which ds_hetero does not build. Sequence parallelism is refused too: there the
decoder runs on sequence shards and receives the full sequence's 4-D mask (context_parallel/), but
a Gated DeltaNet layer wants the 2-D padding mask of the whole sequence after its region's
all-gather, and the gated full-attention class is not among the sequence-sharded attention classes.
"""

from __future__ import annotations

import torch
from torch import nn

from ...models.language_stage import LanguageStage
from ...models.per_sample_attention import PER_SAMPLE
from ..qwen2_vl.adapter import Qwen2VLAdapter, Qwen2VLVisionStage, vision_token_ids
from .packed_deltanet import apply_segmented_deltanet


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
        """Refuse a sequence-sharded language stage (cp, or sequence parallelism) when the decoder has
        Gated DeltaNet layers: their recurrent state runs over the whole sequence (module docstring);
        and packed rows attended otherwise than per sample (their segments would not reach those layers)."""
        from ...config import SECTION
        from ...errors import HeteroConfigError

        language = cfg.stages["language"]
        linear = linear_attention_layers(self.model.config.text_config)
        if linear and language.cp > 1:
            raise HeteroConfigError(
                f"{SECTION}.stages.language.cp",
                f"Qwen3.5's Gated DeltaNet layers ({len(linear)} of {len(self.model.config.text_config.layer_types)}: "
                f"linear attention) carry a recurrent state along the sequence: with cp={language.cp} each rank "
                f"holds a piece of it and the state would have to pass from cp rank to cp rank, which ds_hetero "
                f"does not build; use cp 1 (shard the language stage with tp, pp and dp instead)")
        if linear and language.sequence_parallel and language.tp > 1:
            raise HeteroConfigError(
                f"{SECTION}.stages.language.sequence_parallel",
                "Qwen3.5 cannot run under sequence parallelism: its decoder would see sequence shards and the "
                "full sequence's 4-D mask, but its Gated DeltaNet (linear-attention) layers need the whole "
                "sequence's padding mask and its gated attention has no sequence-sharded path; set "
                "sequence_parallel false")
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

    def split(self) -> dict[str, nn.Module]:
        return split_qwen3_5(self.model)
