"""Samples for the Qwen2.5-VL and Gemma 3 tests: variable images per sample, including none.

Qwen2.5-VL samples are Qwen2-VL's (tests/vlm_data.qwen_samples: one image run per grid entry);
`qwen_multi_samples` puts several images in one sample. Gemma 3 samples put each image as
<boi> + mm_tokens_per_image placeholders + <eoi>, as Gemma3Processor does, then text.
"""

import torch

from ds_hetero.testing.batches import IGNORE

# (t, h, w) patch grids; 8x8 patches hold four 4x4-patch windows, 4x12 has a partial window
QWEN25_GRIDS = [(1, 8, 8), None, (1, 4, 8), (1, 4, 12), (1, 4, 4), (1, 8, 4), None, (1, 8, 8)]


def qwen_multi_samples(model, images_per_sample, text_len=5, seed=0):
    """One sample per entry: a list of (t, h, w) grids, each its own <start> run <end>, then text."""
    cfg = model.config
    v = cfg.vision_config
    patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for grids in images_per_sample:
        ids, labels, pixels = [], [], []
        for t, h, w in grids:
            n = t * h * w // v.spatial_merge_size**2
            run = torch.cat([torch.tensor([cfg.vision_start_token_id]), torch.full((n,), cfg.image_token_id),
                             torch.tensor([cfg.vision_end_token_id])])
            ids.append(run)
            labels.append(torch.full((n + 2,), IGNORE))
            pixels.append(torch.randn(t * h * w, patch_dim, generator=gen))
        text = torch.randint(2, 250, (text_len,), generator=gen)
        sample = {"input_ids": torch.cat(ids + [text]), "labels": torch.cat(labels + [text])}
        if grids:
            sample["pixel_values"] = torch.cat(pixels)
            sample["image_grid_thw"] = torch.tensor(grids)
        samples.append(sample)
    return samples


def gemma3_samples(model, images_per_sample, text_len=6, seed=0):
    """One sample per entry of `images_per_sample` (an image count, 0 for text only)."""
    cfg = model.config
    v = cfg.vision_config
    t = cfg.mm_tokens_per_image
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for n in images_per_sample:
        text = torch.randint(3, 250, (text_len,), generator=gen)
        block = torch.cat([torch.tensor([cfg.boi_token_index]), torch.full((t,), cfg.image_token_id),
                           torch.tensor([cfg.eoi_token_index])])
        ids = torch.cat([text[:2]] + [block] * n + [text[2:]])
        labels = torch.cat([text[:2]] + [torch.full((t + 2,), IGNORE)] * n + [text[2:]])
        sample = {"input_ids": ids, "labels": labels}
        if n:
            sample["pixel_values"] = torch.randn(n, v.num_channels, v.image_size, v.image_size, generator=gen)
        samples.append(sample)
    return samples


def internvl_samples(model, tiles_per_image, text_len=5, seed=0):
    """One sample per entry: a list of tile counts, one per image (<img> run </img>), then text."""
    cfg = model.config
    v = cfg.vision_config
    t = cfg.image_seq_length
    size = v.image_size[0] if isinstance(v.image_size, (list, tuple)) else v.image_size
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for images in tiles_per_image:
        ids, labels = [], []
        for k in images:
            ids.append(torch.cat([torch.tensor([297]), torch.full((k * t,), cfg.image_token_id), torch.tensor([296])]))
            labels.append(torch.full((k * t + 2,), IGNORE))
        text = torch.randint(2, 250, (text_len,), generator=gen)
        sample = {"input_ids": torch.cat(ids + [text]), "labels": torch.cat(labels + [text])}
        if images:
            sample["pixel_values"] = torch.randn(sum(images), v.num_channels, size, size, generator=gen)
        samples.append(sample)
    return samples


def onevision_model_inputs(adapter, samples, dtype, wrong=False):
    """LlavaOnevisionForConditionalGeneration's own image inputs for these samples: every image's
    tiles padded to the batch's largest count (5-D), image_sizes, images per sample. `wrong`:
    the any-resolution tiles of each image in reverse order (a negative control)."""
    with_image = [s for s in samples if s.get("image_sizes") is not None]
    if not with_image:
        return {}
    per_image = []
    for s in with_image:
        pixels, counts = adapter._tiles_of(s)
        for p in pixels.split(counts):
            per_image.append(torch.cat([p[:1], p[1:].flip(0)]) if wrong else p)
    most = max(p.shape[0] for p in per_image)
    padded = torch.stack([torch.cat([p, p.new_zeros(most - p.shape[0], *p.shape[1:])]) for p in per_image])
    return {"pixel_values": padded.to(dtype),
            "image_sizes": torch.cat([s["image_sizes"].reshape(-1, 2) for s in with_image]),
            "batch_num_images": torch.tensor([s["image_sizes"].reshape(-1, 2).shape[0] for s in with_image])}
