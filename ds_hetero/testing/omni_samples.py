"""Samples for the Qwen2.5-Omni thinker (shared by its tests and benchmark): images, videos and
audio clips, interleaved in one sample in any order, or none.

    omni_samples(model, items_per_sample, text_len, seed)

`items_per_sample`: one list per sample of ("image", (t, h, w)), ("video", (t, h, w)) and
("audio", frames) items in sequence order (a video's seconds per temporal patch: 0.5, 1.0, 1.5,
... by its index in the sample). Layout: text, then per item its start token, placeholders, end token, then
text; labels ignore the placeholders and delimiters.
"""

from __future__ import annotations

import torch

from ds_hetero.families.qwen2_5_omni.adapter import audio_output_length

IGNORE = -100


def omni_samples(model, items_per_sample, text_len=4, seed=0):
    cfg = model.config
    v, a = cfg.vision_config, cfg.audio_config
    patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for items in items_per_sample:
        text = torch.randint(2, 250, (text_len,), generator=gen)
        ids, labels = [text], [text.clone()]
        pixels, grids, frames, lengths = [], [], [], []
        video_pixels, video_grids = [], []
        for kind, shape in items:
            if kind in ("image", "video"):
                t, h, w = shape
                n = t * h * w // v.spatial_merge_size**2
                token = cfg.image_token_id if kind == "image" else cfg.video_token_id
                start, end = cfg.vision_start_token_id, cfg.vision_end_token_id
                (pixels if kind == "image" else video_pixels).append(torch.randn(t * h * w, patch_dim, generator=gen))
                (grids if kind == "image" else video_grids).append(torch.tensor([[t, h, w]]))
            else:
                n = audio_output_length(shape)
                start, token, end = cfg.audio_start_token_id, cfg.audio_token_id, cfg.audio_end_token_id
                frames.append(torch.randn(a.num_mel_bins, shape, generator=gen))
                lengths.append(shape)
            ids.append(torch.cat([torch.tensor([start]), torch.full((n,), token), torch.tensor([end])]))
            labels.append(torch.full((n + 2,), IGNORE))
            more = torch.randint(2, 250, (2,), generator=gen)
            ids.append(more)
            labels.append(more.clone())
        sample = {"input_ids": torch.cat(ids), "labels": torch.cat(labels)}
        if grids:
            sample.update(pixel_values=torch.cat(pixels), image_grid_thw=torch.cat(grids))
        if video_grids:
            sample.update(pixel_values_videos=torch.cat(video_pixels), video_grid_thw=torch.cat(video_grids),
                          video_second_per_grid=0.5 * torch.arange(1, len(video_grids) + 1, dtype=torch.float))
        if lengths:
            sample.update(input_features=torch.cat(frames, dim=1), audio_feature_lengths=torch.tensor(lengths))
        samples.append(sample)
    return samples


def hf_inputs(model, adapter, samples):
    """The unmodified thinker's own keyword arguments for these samples padded into one batch
    (audio as the processor gives it: [clips, mel, frames] padded, with its feature_attention_mask:
    the samples' own where they carry that form, else built from the flattened clips)."""
    batch = adapter.language_inputs(samples)
    audio = adapter.audio_inputs(samples)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    # images and videos as the processor gives them: each kind in its own fields, samples in order
    for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "video_second_per_grid"):
        parts = [s[key] for s in samples if s.get(key) is not None]
        if parts:
            kwargs[key] = torch.cat([p.reshape(-1, 3) if key.endswith("grid_thw") else p for p in parts])
    lens = audio["feature_lens"]
    with_audio = [x for x in samples if x.get("input_features") is not None]
    if with_audio and all(x.get("feature_attention_mask") is not None for x in with_audio):
        # the processor's own padded clips and masks, as it would batch them
        longest = max(int(x["input_features"].shape[-1]) for x in with_audio)
        pad = lambda t: torch.nn.functional.pad(t, (0, longest - t.shape[-1]))  # noqa: E731
        kwargs.update(input_features=torch.cat([pad(x["input_features"]) for x in with_audio]),
                      feature_attention_mask=torch.cat([pad(x["feature_attention_mask"]) for x in with_audio]))
    elif len(lens):
        longest = int(lens.max())
        features = torch.zeros(len(lens), audio["input_features"].shape[0], longest)
        mask = torch.zeros(len(lens), longest, dtype=torch.long)
        for i, piece in enumerate(audio["input_features"].split(lens.tolist(), dim=1)):
            features[i, :, :piece.shape[1]] = piece
            mask[i, :piece.shape[1]] = 1
        kwargs.update(input_features=features, feature_attention_mask=mask)
    return kwargs
