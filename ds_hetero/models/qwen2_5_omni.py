"""Qwen2.5-Omni thinker (`Qwen2_5OmniThinkerForConditionalGeneration`) split into three stages.

    vision   : patch embed + windowed vision blocks + merger    pixel_values [patches, D], image_grid_thw [n, 3]
                                                                -> rows [sum_i t*h*w / merge^2, H_text]
    audio    : conv front end + audio blocks + pool + proj       input_features [mel, frames], feature_lens [n]
                                                                -> rows [sum_i out_len(frames_i), H_text]
    language : embeddings + Qwen2 decoder + lm_head             (LanguageStage: each encoder's rows
                                                                replace its own placeholders)

Samples: `input_ids`, `labels`, and per modality (either, both, or neither):
    image   `pixel_values` [patches, D], `image_grid_thw` [n_images, 3]; each image one run of image
            placeholders between vision start/end tokens
    audio   `input_features` [n_mel, total frames] (the clips' frames concatenated, as the model's
            `get_audio_features` flattens them), `audio_feature_lengths` [n_clips]; each clip one
            run of audio placeholders between audio start/end tokens, out_len(frames) long
Placeholders of both kinds interleave freely in one sample; the language stage scatters each
encoder's rows into its own placeholders, in sequence order.

The time-aligned multimodal rotary positions (TMRoPE) are data, computed on the full sequence
by the model's own `get_rope_index` from `input_ids`, the image grids and the audio lengths,
and handed to the language stage as `position_ids` (with a sequence-sharded language stage each
shard takes its slice of them, so positions never depend on the shard).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ..step.balance import transformer_cost
from .adapter import EncoderPort, StageAdapter
from .stages import LanguageStage, empty_rows


def audio_output_length(frames: int) -> int:
    """Boundary rows of a clip of `frames` mel frames (the tower's stride-2 conv, then stride-2 pooling;
    `Qwen2_5OmniAudioEncoder._get_feat_extract_output_lengths`)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def placeholder_runs(ids: torch.Tensor, token_id: int) -> list[int]:
    """Lengths of the runs of `token_id` in `ids`, in order: one run per item (image, clip)."""
    hit = (ids.reshape(-1) == token_id).int()
    edges = torch.diff(hit, prepend=hit.new_zeros(1), append=hit.new_zeros(1))
    starts, ends = torch.nonzero(edges == 1).flatten(), torch.nonzero(edges == -1).flatten()
    return (ends - starts).tolist()


class OmniVisionStage(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.visual = model.model.visual

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        if image_grid_thw.shape[0] == 0:  # no image here: the smallest one, times zero (stages.empty_rows)
            m = self.visual.spatial_merge_size
            return empty_rows(self, {"pixel_values": pixel_values.new_zeros(m * m, pixel_values.shape[-1]),
                                     "image_grid_thw": image_grid_thw.new_tensor([[1, m, m]])})
        dtype = self.visual.merger.mlp[-1].weight.dtype
        return self.visual(pixel_values.to(dtype), grid_thw=image_grid_thw).pooler_output


class OmniAudioStage(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.audio_tower = model.model.audio_tower

    def forward(self, input_features: torch.Tensor, feature_lens: torch.Tensor) -> torch.Tensor:
        if feature_lens.shape[0] == 0:  # no clip here: one attention window of silence, times zero
            frames = 2 * self.audio_tower.n_window
            return empty_rows(self, {"input_features": input_features.new_zeros(input_features.shape[0], frames),
                                     "feature_lens": feature_lens.new_tensor([frames])})
        dtype = self.audio_tower.conv1.weight.dtype
        return self.audio_tower(input_features.to(dtype), feature_lens=feature_lens).last_hidden_state

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Every parameter but `audio_bos_eos_token`, which the thinker's forward never uses: a
        single-process optimizer skips it (no gradient); ZeRO would decay it as if its gradient
        were zero. Leaving it out of the optimizer keeps both the same."""
        unused = {id(p) for p in self.audio_tower.audio_bos_eos_token.parameters()}
        return [p for p in self.parameters() if p.requires_grad and id(p) not in unused]


def split_qwen2_5_omni(model: nn.Module) -> dict[str, nn.Module]:
    cfg = model.config
    language = LanguageStage(model.model.language_model, model.lm_head, (cfg.image_token_id, cfg.audio_token_id))
    return {"vision": OmniVisionStage(model), "audio": OmniAudioStage(model), "language": language}


class Qwen2_5OmniAdapter(StageAdapter):
    ENCODER_STAGES = ("vision", "audio")

    def __init__(self, model: nn.Module):
        self.model = model
        cfg = model.config
        self.image_token_id = cfg.image_token_id
        self.audio_token_id = cfg.audio_token_id
        self.pad_token_id = cfg.text_config.pad_token_id or 0
        v, a = cfg.vision_config, cfg.audio_config
        self.merge = v.spatial_merge_size
        self.patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size
        self.window = v.window_size // v.patch_size  # patches per window side
        self._vision_width = (v.hidden_size, v.intermediate_size)
        self.n_mel, self.n_window = a.num_mel_bins, a.n_window
        self._audio_width = (a.d_model, a.encoder_ffn_dim)

    def encoders(self) -> dict[str, EncoderPort]:
        ports = getattr(self, "_ports", None)
        if ports is None:
            ports = self._ports = {
                "vision": EncoderPort("vision", self.image_token_id, self.image_rows, self.image_cost,
                                      self.select_images, self.vision_inputs),
                "audio": EncoderPort("audio", self.audio_token_id, self.audio_rows, self.audio_cost,
                                     self.select_audios, self.audio_inputs),
            }
        return ports

    def split(self) -> dict[str, nn.Module]:
        return split_qwen2_5_omni(self.model)

    def vision_modules(self) -> list[nn.Module]:
        return [self.model.model.visual]  # blocks and merger

    def encoder_modules(self) -> dict[str, list[nn.Module]]:
        return {"vision": self.vision_modules(), "audio": [self.model.model.audio_tower]}

    # ------------------------------------------------------------------ images
    def image_rows(self, sample: dict[str, Any]) -> list[int]:
        return placeholder_runs(sample["input_ids"], self.image_token_id)

    def image_cost(self, rows: int) -> int:
        # Windowed blocks attend within windows of window^2 patches (full attention in a few
        # blocks: counted as windowed, the cost only has to order images by work).
        patches = rows * self.merge**2
        return transformer_cost(patches, min(patches, self.window**2), *self._vision_width)

    def select_images(self, sample: dict[str, Any], images: Sequence[int]) -> dict[str, Any]:
        grid = sample["image_grid_thw"].reshape(-1, 3)
        if len(images) == grid.shape[0]:
            return sample
        starts = [0] + grid.prod(-1).cumsum(0).tolist()
        pixels = torch.cat([sample["pixel_values"][starts[k]:starts[k + 1]] for k in images])
        return {"pixel_values": pixels, "image_grid_thw": grid[list(images)]}

    def vision_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        with_image = [s for s in samples if s.get("image_grid_thw") is not None]
        if not with_image:
            return {"pixel_values": torch.zeros(0, self.patch_dim), "image_grid_thw": torch.zeros(0, 3, dtype=torch.long)}
        return {"pixel_values": torch.cat([s["pixel_values"] for s in with_image]),
                "image_grid_thw": torch.cat([s["image_grid_thw"].reshape(-1, 3) for s in with_image])}

    # ------------------------------------------------------------------ audio
    def audio_rows(self, sample: dict[str, Any]) -> list[int]:
        return placeholder_runs(sample["input_ids"], self.audio_token_id)

    def audio_cost(self, rows: int) -> int:
        # The work of a clip follows its frames (about 4 per row): after the stride-2 conv, 2 tokens
        # per row run through every block, attending within chunks of n_window tokens.
        tokens = 2 * rows
        return transformer_cost(tokens, min(tokens, self.n_window), *self._audio_width)

    def select_audios(self, sample: dict[str, Any], clips: Sequence[int]) -> dict[str, Any]:
        lengths = sample["audio_feature_lengths"].reshape(-1)
        if len(clips) == lengths.shape[0]:
            return sample
        starts = [0] + lengths.cumsum(0).tolist()
        frames = torch.cat([sample["input_features"][:, starts[k]:starts[k + 1]] for k in clips], dim=1)
        return {"input_features": frames, "audio_feature_lengths": lengths[list(clips)]}

    def audio_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        with_audio = [s for s in samples if s.get("audio_feature_lengths") is not None]
        if not with_audio:
            return {"input_features": torch.zeros(self.n_mel, 0), "feature_lens": torch.zeros(0, dtype=torch.long)}
        return {"input_features": torch.cat([s["input_features"] for s in with_audio], dim=1),
                "feature_lens": torch.cat([s["audio_feature_lengths"].reshape(-1) for s in with_audio])}

    # ------------------------------------------------------------------ language
    def position_ids(self, batch: dict[str, torch.Tensor], samples: Sequence[dict[str, Any]]) -> torch.Tensor | None:
        """TMRoPE positions of the padded batch, by the model's own `get_rope_index` (as its forward
        computes them from `image_grid_thw` and the audio lengths of the same samples)."""
        grids = [s["image_grid_thw"].reshape(-1, 3) for s in samples if s.get("image_grid_thw") is not None]
        lengths = [s["audio_feature_lengths"].reshape(-1) for s in samples if s.get("audio_feature_lengths") is not None]
        position_ids, _ = self.model.model.get_rope_index(
            batch["input_ids"], torch.cat(grids) if grids else None, None, batch["attention_mask"], False,
            torch.cat(lengths) if lengths else None, None)
        return position_ids

    def check_sample(self, sample: dict[str, Any], index: int) -> None:
        super().check_sample(sample, index)
        grid = sample.get("image_grid_thw")
        per_image = [] if grid is None else (grid.reshape(-1, 3).prod(-1) // self.merge**2).tolist()
        if self.image_rows(sample) != per_image:
            raise ValueError(
                f"sample {index}: image placeholder runs {self.image_rows(sample)} (id {self.image_token_id}) do not "
                f"match image_grid_thw {None if grid is None else grid.reshape(-1, 3).tolist()}, which gives "
                f"{per_image}; each image needs its own run (vision start/end tokens around it)")
        if grid is not None and sample["pixel_values"].shape[0] != int(grid.reshape(-1, 3).prod(-1).sum()):
            raise ValueError(
                f"sample {index}: pixel_values has {sample['pixel_values'].shape[0]} patches but image_grid_thw "
                f"{grid.reshape(-1, 3).tolist()} needs {int(grid.reshape(-1, 3).prod(-1).sum())}")
        lengths = sample.get("audio_feature_lengths")
        frames = [] if lengths is None else lengths.reshape(-1).tolist()
        per_clip = [audio_output_length(f) for f in frames]
        if self.audio_rows(sample) != per_clip:
            raise ValueError(
                f"sample {index}: audio placeholder runs {self.audio_rows(sample)} (id {self.audio_token_id}) do not "
                f"match audio_feature_lengths {frames}, which give {per_clip} rows; each clip needs its own run "
                "(audio start/end tokens around it)")
        if lengths is not None and tuple(sample["input_features"].shape) != (self.n_mel, sum(frames)):
            raise ValueError(
                f"sample {index}: input_features has shape {tuple(sample['input_features'].shape)} but the clips "
                f"need [{self.n_mel}, {sum(frames)}] (mel bins, their frames concatenated)")
