"""Samples with video clips and images for the Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5),
shared by their tests and benchmarks, laid out as the processors lay them out.

    video_samples(model, items_per_sample, text_len, seed, frame_runs, seconds)

`items_per_sample`: one list per sample of ("image", (t, h, w)) and ("video", (t, h, w)) items in
sequence order (h, w in patches; a video's t in temporal patches; with `seconds` (Qwen2.5-VL) its
seconds per temporal patch in `second_per_grid_ts`, 0.5, 1.0, 1.5, ... by its index in the sample).
Layout: text, then per item its start token, placeholders and end token, then two text tokens. With
`frame_runs` (Qwen3-VL, Qwen3.5) every temporal patch of a clip is its own run after two timestamp
tokens, as those processors write "<0.5 seconds><|vision_start|>...<|vision_end|>" per frame. Labels
ignore placeholders, delimiters and timestamps.
"""

from __future__ import annotations

import torch

IGNORE = -100


def video_samples(model, items_per_sample, text_len=4, seed=0, frame_runs=False, seconds=False):
    cfg = model.config
    v = cfg.vision_config
    m = v.spatial_merge_size
    patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size
    start, end = cfg.vision_start_token_id, cfg.vision_end_token_id
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for items in items_per_sample:
        text = torch.randint(2, 250, (text_len,), generator=gen)
        ids, labels = [text], [text.clone()]
        media = {"image": ([], []), "video": ([], [])}
        for kind, (t, h, w) in items:
            token = cfg.image_token_id if kind == "image" else cfg.video_token_id
            runs = [(1, h, w)] * t if kind == "video" and frame_runs else [(t, h, w)]
            for k, (rt, rh, rw) in enumerate(runs):
                if frame_runs and kind == "video":  # the frame's timestamp text
                    stamp = torch.randint(2, 250, (2,), generator=gen)
                    ids.append(stamp)
                    labels.append(torch.full((2,), IGNORE))
                n = rt * rh * rw // m**2
                ids.append(torch.cat([torch.tensor([start]), torch.full((n,), token), torch.tensor([end])]))
                labels.append(torch.full((n + 2,), IGNORE))
            media[kind][0].append(torch.randn(t * h * w, patch_dim, generator=gen))
            media[kind][1].append(torch.tensor([[t, h, w]]))
            more = torch.randint(2, 250, (2,), generator=gen)
            ids.append(more)
            labels.append(more.clone())
        sample = {"input_ids": torch.cat(ids), "labels": torch.cat(labels)}
        if media["image"][1]:
            sample.update(pixel_values=torch.cat(media["image"][0]), image_grid_thw=torch.cat(media["image"][1]))
        if media["video"][1]:
            n = len(media["video"][1])
            sample.update(pixel_values_videos=torch.cat(media["video"][0]), video_grid_thw=torch.cat(media["video"][1]))
            if seconds:
                sample["second_per_grid_ts"] = 0.5 * torch.arange(1, n + 1, dtype=torch.float)
        samples.append(sample)
    return samples


def hf_video_inputs(model, adapter, samples):
    """The unmodified model's own keyword arguments for these samples padded into one batch: images
    and videos each in their own fields, samples in order, as the processor batches them, and the
    processor's `mm_token_type_ids` (Qwen2.5-VL: `second_per_grid_ts` too)."""
    from ds_hetero.families.qwen2_vl.video import mm_token_types

    batch = adapter.language_inputs(samples)
    ids = batch["input_ids"]
    kwargs = dict(input_ids=ids, attention_mask=batch["attention_mask"], labels=batch["labels"],
                  mm_token_type_ids=mm_token_types(ids, model.config.image_token_id, model.config.video_token_id))
    keys = ["pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"]
    if adapter.SECONDS_FIELD is not None:
        keys.append(adapter.SECONDS_FIELD)
    for key in keys:
        parts = [s[key] for s in samples if s.get(key) is not None]
        if parts:
            kwargs[key] = torch.cat([p.reshape(-1, 3) if key.endswith("grid_thw") else p for p in parts])
    return kwargs
