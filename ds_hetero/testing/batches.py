"""Deterministic LLaVA samples and the single-process reference loss used by parity tests."""

import torch

IGNORE = -100


def llava_samples(model, n, text_len=8, seed=0):
    """`n` samples: image placeholders then text; labels are the text ids (placeholders ignored)."""
    from ds_hetero.toy import llava_tokens_per_image

    cfg = model.config
    t = llava_tokens_per_image(model)
    image = cfg.vision_config.image_size
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(n):
        text = torch.randint(0, cfg.image_token_id - 1, (text_len,), generator=gen)
        ids = torch.cat([torch.full((t,), cfg.image_token_id), text])
        labels = torch.cat([torch.full((t,), IGNORE), text])
        samples.append({"input_ids": ids, "labels": labels, "pixel_values": torch.randn(1, 3, image, image, generator=gen)})
    return samples


def collate(samples):
    return {k: torch.cat([s[k].unsqueeze(0) if s[k].dim() == 1 else s[k] for s in samples]) for k in samples[0]}


def token_loss_sum(logits, labels):
    """Sum of next-token cross-entropies over label tokens (HF's shift convention)."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
        ignore_index=IGNORE, reduction="sum",
    )


def label_count(samples):
    return sum(int((s["labels"][1:] != IGNORE).sum()) for s in samples)


def qwen_samples(model, grids, text_len=6, seed=0):
    """One sample per entry of `grids`: (t, h, w) patches of one image, or None for a text-only sample.

    Layout: <vision_start> image placeholders <vision_end> text. t*h*w/4 placeholders (2x2 merge).
    """
    cfg = model.config
    v = cfg.vision_config
    patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for grid in grids:
        text = torch.randint(2, 250, (text_len,), generator=gen)
        if grid is None:
            ids = text
            labels = text.clone()
            sample = {}
        else:
            t, h, w = grid
            n = t * h * w // (v.spatial_merge_size**2)
            ids = torch.cat([torch.tensor([cfg.vision_start_token_id]), torch.full((n,), cfg.image_token_id),
                             torch.tensor([cfg.vision_end_token_id]), text])
            labels = torch.cat([torch.full((n + 2,), IGNORE), text])
            sample = {"pixel_values": torch.randn(t * h * w, patch_dim, generator=gen),
                      "image_grid_thw": torch.tensor([[t, h, w]])}
        samples.append({"input_ids": ids, "labels": labels, **sample})
    return samples
