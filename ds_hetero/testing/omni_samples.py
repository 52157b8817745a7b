"""Samples for the Qwen2.5-Omni thinker (shared by its tests and benchmark): images and audio clips,
interleaved in one sample in any order, or neither.

    omni_samples(model, items_per_sample, text_len, seed)

`items_per_sample`: one list per sample of ("image", (t, h, w)) and ("audio", frames) items in
sequence order. Layout: text, then per item its start token, placeholders, end token, then
text; labels ignore the placeholders and delimiters.
"""

from __future__ import annotations

import torch

from ds_hetero.models.qwen2_5_omni import audio_output_length

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
        for kind, shape in items:
            if kind == "image":
                t, h, w = shape
                n = t * h * w // v.spatial_merge_size**2
                start, token, end = cfg.vision_start_token_id, cfg.image_token_id, cfg.vision_end_token_id
                pixels.append(torch.randn(t * h * w, patch_dim, generator=gen))
                grids.append(torch.tensor([[t, h, w]]))
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
        if lengths:
            sample.update(input_features=torch.cat(frames, dim=1), audio_feature_lengths=torch.tensor(lengths))
        samples.append(sample)
    return samples


def hf_inputs(model, adapter, samples):
    """The unmodified thinker's own keyword arguments for these samples padded into one batch
    (audio as the processor gives it: [clips, mel, frames] padded, with its feature_attention_mask)."""
    batch = adapter.language_inputs(samples)
    vision = adapter.vision_inputs(samples)
    audio = adapter.audio_inputs(samples)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    if len(vision["image_grid_thw"]):
        kwargs.update(pixel_values=vision["pixel_values"], image_grid_thw=vision["image_grid_thw"])
    lens = audio["feature_lens"]
    if len(lens):
        longest = int(lens.max())
        features = torch.zeros(len(lens), audio["input_features"].shape[0], longest)
        mask = torch.zeros(len(lens), longest, dtype=torch.long)
        for i, piece in enumerate(audio["input_features"].split(lens.tolist(), dim=1)):
            features[i, :, :piece.shape[1]] = piece
            mask[i, :piece.shape[1]] = 1
        kwargs.update(input_features=features, feature_attention_mask=mask)
    return kwargs
