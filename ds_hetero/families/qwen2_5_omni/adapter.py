"""Qwen2.5-Omni thinker (`Qwen2_5OmniThinkerForConditionalGeneration`) split into three stages.

    vision   : patch embed + windowed vision blocks + merger    pixel_values [patches, D], image_grid_thw [n, 3]
                                                                (images and video clips alike)
                                                                -> rows [sum_i t*h*w / merge^2, H_text]
    audio    : conv front end + audio blocks + pool + proj       input_features [mel, frames], feature_lens [n]
                                                                -> rows [sum_i out_len(frames_i), H_text]
    language : embeddings + Qwen2 decoder + lm_head             (LanguageStage: each encoder's rows
                                                                replace its own placeholders)

Samples: `input_ids`, `labels`, and per modality (either, both, or neither):
    image   `pixel_values` [patches, D], `image_grid_thw` [n_images, 3]; each image one run of image
            placeholders between vision start/end tokens
    video   `pixel_values_videos` [patches, D], `video_grid_thw` [n_videos, 3], `video_second_per_grid`
            [n_videos] (seconds per temporal patch, as the processor gives it); each video one run of
            video placeholders between vision start/end tokens. The vision stage encodes a sample's
            images and videos as one list of items in sequence order (the tower attends within an
            item), so its rows fill image and video placeholders alike, in sequence order.
    audio   either form the thinker's forward takes (audio_fields):
            `input_features` [n_clips, n_mel, frames] padded + `feature_attention_mask` [n_clips, frames]
            (what Qwen2_5OmniProcessor emits), or `input_features` [n_mel, total frames] (the clips'
            frames concatenated, as `get_audio_features` flattens them) + `audio_feature_lengths`
            [n_clips]; each clip one run of audio placeholders between audio start/end tokens,
            out_len(frames) long
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

from ...models.item_cost import transformer_cost
from ...models.adapter import EncoderPort, StageAdapter
from ...models.language_stage import LanguageStage, empty_rows


def audio_output_length(frames: int) -> int:
    """Boundary rows of a clip of `frames` mel frames (the tower's stride-2 conv, then stride-2 pooling;
    `Qwen2_5OmniAudioEncoder._get_feat_extract_output_lengths`)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def placeholder_runs(ids: torch.Tensor, token_id: int) -> list[int]:
    """Lengths of the runs of `token_id` in `ids`, in order: one run per item (image, clip)."""
    return [n for _, n in typed_runs(ids, (token_id,))]


def typed_runs(ids: torch.Tensor, token_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(id, length) of each run of one of `token_ids` in `ids`, in sequence order (an image run
    and a video run are two items even where they touch)."""
    ids = ids.reshape(-1)
    hit = torch.isin(ids, torch.tensor(list(token_ids), dtype=ids.dtype))
    value = torch.where(hit, ids, ids.new_full((), -1))
    change = torch.nonzero(value[1:] != value[:-1]).flatten() + 1
    bounds = [0, *change.tolist(), ids.numel()]
    return [(int(value[a]), b - a) for a, b in zip(bounds[:-1], bounds[1:]) if hit[a]]


def audio_fields(sample: dict[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(input_features [n_mel, total frames], frames per clip [n_clips]) of a sample in either form
    (the module docstring), flattened as the thinker's `get_audio_features` flattens the padded one;
    (None, None) without audio. check_audio_fields says what is wrong with any other form."""
    features, mask = sample.get("input_features"), sample.get("feature_attention_mask")
    if mask is None:
        lengths = sample.get("audio_feature_lengths")
        return features, None if lengths is None else lengths.reshape(-1)
    keep = mask.bool()
    return features.permute(0, 2, 1)[keep].permute(1, 0), keep.sum(-1).long()


def check_audio_fields(sample: dict[str, Any], index: int, n_mel: int) -> None:
    """A ValueError naming the field for an audio form the thinker's forward does not take."""
    features, mask, lengths = (sample.get(k) for k in ("input_features", "feature_attention_mask",
                                                       "audio_feature_lengths"))
    forms = ("give input_features [clips, mel, frames] with feature_attention_mask [clips, frames] (the "
             "processor's output) or input_features [mel, total frames] with audio_feature_lengths [clips]; "
             f"n_mel = {n_mel}")
    if features is None:
        if mask is not None or lengths is not None:
            given = "feature_attention_mask" if mask is not None else "audio_feature_lengths"
            raise ValueError(f"sample {index}: {given} without input_features; {forms}")
        return
    shape = tuple(features.shape)
    if mask is None:
        if features.dim() != 2 or lengths is None:
            what = "feature_attention_mask" if features.dim() == 3 else "audio_feature_lengths"
            raise ValueError(f"sample {index}: input_features has shape {shape} and no {what}; {forms}")
        return
    if features.dim() != 3 or features.shape[1] != n_mel or tuple(mask.shape) != (shape[0], shape[2]):
        raise ValueError(f"sample {index}: input_features {shape} and feature_attention_mask {tuple(mask.shape)} do "
                         f"not fit: the mask needs one row per clip and one entry per frame; {forms}")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"sample {index}: feature_attention_mask holds values other than 0 and 1")
    if lengths is not None and lengths.reshape(-1).tolist() != mask.bool().sum(-1).tolist():
        raise ValueError(f"sample {index}: audio_feature_lengths {lengths.reshape(-1).tolist()} disagree with "
                         f"feature_attention_mask, which gives {mask.bool().sum(-1).tolist()}; give one of them")


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


def _clip_lengths(sample: dict[str, Any]) -> torch.Tensor | None:
    """Frames per clip, from the mask or the lengths (no flattening: for the positions)."""
    mask = sample.get("feature_attention_mask")
    if mask is not None:
        return mask.bool().sum(-1).long()
    lengths = sample.get("audio_feature_lengths")
    return None if lengths is None else lengths.reshape(-1)


def split_qwen2_5_omni(model: nn.Module) -> dict[str, nn.Module]:
    cfg = model.config
    language = LanguageStage(model.model.language_model, model.lm_head,
                             ((cfg.image_token_id, cfg.video_token_id), cfg.audio_token_id))
    return {"vision": OmniVisionStage(model), "audio": OmniAudioStage(model), "language": language}


class Qwen2_5OmniAdapter(StageAdapter):
    SAMPLE_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                     "video_second_per_grid", "input_features", "feature_attention_mask", "audio_feature_lengths")
    ENCODER_STAGES = ("vision", "audio")

    def __init__(self, model: nn.Module):
        self.model = model
        cfg = model.config
        self.image_token_id = cfg.image_token_id
        self.audio_token_id = cfg.audio_token_id
        self.video_token_id = cfg.video_token_id
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
                                      self.select_images, self.vision_inputs, more_ids=(self.video_token_id,)),
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

    # ------------------------------------------------------------------ images and videos
    def image_rows(self, sample: dict[str, Any]) -> list[int]:
        """Rows of each vision item (image or video) of the sample, in sequence order."""
        return [n for _, n in typed_runs(sample["input_ids"], (self.image_token_id, self.video_token_id))]

    def vision_items(self, sample: dict[str, Any]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(patches, grid [1, 3]) of each image and video of the sample, in sequence order."""
        pieces = {}
        for token, pixels, grids in ((self.image_token_id, "pixel_values", "image_grid_thw"),
                                     (self.video_token_id, "pixel_values_videos", "video_grid_thw")):
            grid = sample.get(grids)
            grid = torch.zeros(0, 3, dtype=torch.long) if grid is None else grid.reshape(-1, 3)
            starts = [0] + grid.prod(-1).cumsum(0).tolist()
            pieces[token] = iter([(sample[pixels][starts[k]:starts[k + 1]], grid[k:k + 1])
                                  for k in range(grid.shape[0])])
        return [next(pieces[token]) for token, _ in typed_runs(sample["input_ids"], tuple(pieces))]

    def image_cost(self, rows: int) -> int:
        # Windowed blocks attend within windows of window^2 patches (full attention in a few
        # blocks: counted as windowed, the cost only has to order images by work).
        patches = rows * self.merge**2
        return transformer_cost(patches, min(patches, self.window**2), *self._vision_width)

    def select_images(self, sample: dict[str, Any], images: Sequence[int]) -> dict[str, Any]:
        """The tower's inputs for these vision items (indices in sequence order, images and videos
        alike), as one list of images: the tower treats a video as an image of t temporal patches."""
        if sample.get("video_grid_thw") is None and len(images) == sample["image_grid_thw"].reshape(-1, 3).shape[0]:
            return sample
        items = self.vision_items(sample)
        return {"pixel_values": torch.cat([items[k][0] for k in images]),
                "image_grid_thw": torch.cat([items[k][1] for k in images])}

    def vision_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Every image and video of the samples, samples in order, items in sequence order."""
        samples = [s if s.get("video_grid_thw") is None else self.select_images(s, range(len(self.image_rows(s))))
                   for s in samples]
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
        """These clips' fields, flattened ([n_mel, their frames] + audio_feature_lengths)."""
        features, lengths = audio_fields(sample)
        if len(clips) == lengths.shape[0] and sample.get("feature_attention_mask") is None:
            return sample
        starts = [0] + lengths.cumsum(0).tolist()
        frames = torch.cat([features[:, starts[k]:starts[k + 1]] for k in clips], dim=1)
        return {"input_features": frames, "audio_feature_lengths": lengths[list(clips)]}

    def audio_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        clips = [audio_fields(s) for s in samples]
        clips = [(f, n) for f, n in clips if n is not None]
        if not clips:
            return {"input_features": torch.zeros(self.n_mel, 0), "feature_lens": torch.zeros(0, dtype=torch.long)}
        return {"input_features": torch.cat([f for f, _ in clips], dim=1),
                "feature_lens": torch.cat([n for _, n in clips])}

    # ------------------------------------------------------------------ language
    def position_ids(self, batch: dict[str, torch.Tensor], samples: Sequence[dict[str, Any]]) -> torch.Tensor | None:
        """TMRoPE positions of the padded batch, by the model's own `get_rope_index` (as its forward
        computes them from `image_grid_thw` and the audio lengths of the same samples)."""
        def cat(key, shape=(-1,)):
            parts = [s[key].reshape(shape) for s in samples if s.get(key) is not None]
            return torch.cat(parts) if parts else None

        lengths = [n for n in (_clip_lengths(s) for s in samples) if n is not None]

        # audio in video (the thinker's `use_audio_in_video`) is refused by check_sample
        position_ids, _ = self.model.model.get_rope_index(
            batch["input_ids"], cat("image_grid_thw", (-1, 3)), cat("video_grid_thw", (-1, 3)), batch["attention_mask"],
            False, torch.cat(lengths) if lengths else None, cat("video_second_per_grid"))
        return position_ids

    def _check_vision_items(self, sample, index, what, token, pixels, grids) -> None:
        grid = sample.get(grids)
        runs = placeholder_runs(sample["input_ids"], token)
        per_item = [] if grid is None else (grid.reshape(-1, 3).prod(-1) // self.merge**2).tolist()
        if runs != per_item:
            raise ValueError(
                f"sample {index}: {what} placeholder runs {runs} (id {token}) do not match {grids} "
                f"{None if grid is None else grid.reshape(-1, 3).tolist()}, which gives {per_item}; each {what} needs "
                "its own run (vision start/end tokens around it)")
        if grid is not None and sample[pixels].shape[0] != int(grid.reshape(-1, 3).prod(-1).sum()):
            raise ValueError(
                f"sample {index}: {pixels} has {sample[pixels].shape[0]} patches but {grids} "
                f"{grid.reshape(-1, 3).tolist()} needs {int(grid.reshape(-1, 3).prod(-1).sum())}")

    def check_sample(self, sample: dict[str, Any], index: int) -> None:
        super().check_sample(sample, index)
        if sample.get("use_audio_in_video"):
            raise ValueError(f"sample {index}: use_audio_in_video (a video's audio interleaved with its frames) is not "
                             "supported; give the video's audio as its own clip")
        for what, token, pixels, grids in (("image", self.image_token_id, "pixel_values", "image_grid_thw"),
                                           ("video", self.video_token_id, "pixel_values_videos", "video_grid_thw")):
            self._check_vision_items(sample, index, what, token, pixels, grids)
        videos = sample.get("video_grid_thw")
        if videos is not None:
            seconds = sample.get("video_second_per_grid")
            if seconds is None or seconds.numel() != videos.reshape(-1, 3).shape[0]:
                raise ValueError(f"sample {index}: video_second_per_grid needs one entry per video "
                                 f"({videos.reshape(-1, 3).shape[0]}), as the processor gives it")
        check_audio_fields(sample, index, self.n_mel)
        features, lengths = audio_fields(sample)
        frames = [] if lengths is None else lengths.reshape(-1).tolist()
        per_clip = [audio_output_length(f) for f in frames]
        if self.audio_rows(sample) != per_clip:
            raise ValueError(
                f"sample {index}: audio placeholder runs {self.audio_rows(sample)} (id {self.audio_token_id}) do not "
                f"match audio_feature_lengths {frames}, which give {per_clip} rows; each clip needs its own run "
                "(audio start/end tokens around it)")
        if lengths is not None and sample.get("feature_attention_mask") is None \
                and tuple(features.shape) != (self.n_mel, sum(frames)):
            raise ValueError(
                f"sample {index}: input_features has shape {tuple(features.shape)} but the clips of "
                f"audio_feature_lengths need [{self.n_mel}, {sum(frames)}] (mel bins, their frames concatenated)")
