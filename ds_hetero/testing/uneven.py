"""Samples with highly uneven image tokens: several images per sample, none, one sample with most.

Per step the image counts rotate, so every step's assignment differs. Shared by the balance
parity tests (tests/engine/test_balance_engine.py) and the pure assignment tests.
"""

import torch

IGNORE = -100

# Images per sample (LLaVA: equal-size images), 8 samples: one holds most of the batch's tokens.
LLAVA_IMAGES = [5, 0, 1, 0, 2, 1, 0, 1]
# Qwen2-VL grids per sample (t, h, w); rows = h * w / 4. Sample 0 holds 64 + 4 of the 96 rows.
QWEN_GRIDS = [[(1, 16, 16), (1, 4, 4)], None, [(1, 4, 4)], None, [(1, 4, 8), (1, 4, 4)], None, [(1, 8, 4)], [(1, 4, 4)]]


def rotate(xs, step):
    k = step % len(xs)
    return xs[k:] + xs[:k]


def llava_uneven(model, images_per_sample, text_len=6, seed=0):
    from ds_hetero.toy import llava_tokens_per_image

    cfg = model.config
    t = llava_tokens_per_image(model)
    size = cfg.vision_config.image_size
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i, n in enumerate(images_per_sample):
        text = torch.randint(0, cfg.image_token_id - 1, (text_len + i % 3,), generator=gen)
        ids = torch.cat([torch.full((n * t,), cfg.image_token_id), text])
        labels = torch.cat([torch.full((n * t,), IGNORE), text])
        sample = {"input_ids": ids, "labels": labels}
        if n:
            sample["pixel_values"] = torch.randn(n, 3, size, size, generator=gen)
        samples.append(sample)
    return samples


def qwen_uneven(model, grids_per_sample, text_len=5, seed=0):
    """Each image is one run <vision_start> placeholders <vision_end>, as the processor writes it."""
    cfg = model.config
    v = cfg.vision_config
    patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i, grids in enumerate(grids_per_sample):
        text = torch.randint(2, 250, (text_len + i % 3,), generator=gen)
        ids, labels, pixels = [], [], []
        for t, h, w in grids or []:
            n = t * h * w // (v.spatial_merge_size**2)
            ids += [torch.tensor([cfg.vision_start_token_id]), torch.full((n,), cfg.image_token_id),
                    torch.tensor([cfg.vision_end_token_id])]
            labels.append(torch.full((n + 2,), IGNORE))
            pixels.append(torch.randn(t * h * w, patch_dim, generator=gen))
        sample = {"input_ids": torch.cat(ids + [text]), "labels": torch.cat(labels + [text])}
        if grids:
            sample["pixel_values"] = torch.cat(pixels)
            sample["image_grid_thw"] = torch.tensor(grids)
        samples.append(sample)
    return samples


def uneven_batches(family, model, steps, batch_size, seed=300):
    """`steps` global batches of `batch_size` (a multiple of 8) with the uneven patterns above, rotated."""
    out = []
    for step in range(steps):
        if family == "llava":
            out.append(llava_uneven(model, rotate(LLAVA_IMAGES * (batch_size // 8), step), seed=seed + step))
        else:
            out.append(qwen_uneven(model, rotate(QWEN_GRIDS * (batch_size // 8), step), seed=seed + step))
    return out
