"""The packing benchmark's model and samples per family: a sample of the SFT mix (images, text tokens) in
each family's own format, at `scale` (576 / scale language tokens per image, as bench_packing.py's LLaVA).

    llava     ds_hetero.toy.tiny_llava: an image is image_size / 4 squared placeholders (clip tower, 4-px patches)
    qwen3.5   ds_hetero.toy.tiny_qwen3_5: Gated DeltaNet layers 3 of every 4; an image is <vision_start>
              placeholders <vision_end>, a (1, h, w) patch grid merged 2x2 (Qwen3.5's processor's layout)
    gemma3    ds_hetero.toy.tiny_gemma3: sliding and full layers alternating; an image is <boi> mm_tokens_per_image
              placeholders <eoi> (Gemma3Processor's layout), the sliding window 1024 / scale as the released models'
"""

from __future__ import annotations

import math

import torch

IGNORE = -100
FAMILIES = ("llava", "qwen3.5", "gemma3")


def image_side(scale: int) -> int:
    """Patches per merged image side: (576 / scale) language tokens per image."""
    return int(math.isqrt(576 // scale))


def make_model(family: str, scale: int, text_hidden: int, text_layers: int):
    from ds_hetero import toy

    side = image_side(scale)
    if family == "llava":
        return toy.tiny_llava("clip", seed=0, text_hidden=text_hidden, text_layers=text_layers, vision_hidden=32,
                              image_size=side * 4, patch_size=4)
    if family == "qwen3.5":
        return toy.tiny_qwen3_5(seed=0, text_hidden=text_hidden, text_layers=text_layers)
    if family == "gemma3":
        return toy.tiny_gemma3(seed=0, text_hidden=text_hidden, text_layers=text_layers, image_size=side * 4,
                               patch_size=4, tokens_per_image=side * side, sliding_window=max(4, 1024 // scale))
    raise ValueError(f"--family: one of {FAMILIES}, got {family!r}")


def mix_sample(model, family: str, images: int, text_len: int, scale: int, gen: torch.Generator) -> dict:
    """One sample: `images` images then `text_len` text tokens (labels: the text)."""
    cfg = model.config
    side = image_side(scale)
    if family == "llava":
        text = torch.randint(0, cfg.image_token_id - 1, (text_len,), generator=gen)
        t = side * side
        size = cfg.vision_config.image_size
        sample = {"input_ids": torch.cat([torch.full((images * t,), cfg.image_token_id), text]),
                  "labels": torch.cat([torch.full((images * t,), IGNORE), text])}
        if images:
            sample["pixel_values"] = torch.randn(images, 3, size, size, generator=gen)
        return sample
    text = torch.randint(3, 250, (text_len,), generator=gen)
    if family == "qwen3.5":
        v = cfg.vision_config
        h = w = side * v.spatial_merge_size
        n = h * w // v.spatial_merge_size**2
        run = torch.cat([torch.tensor([cfg.vision_start_token_id]), torch.full((n,), cfg.image_token_id),
                         torch.tensor([cfg.vision_end_token_id])])
        sample = {"input_ids": torch.cat([run] * images + [text]),
                  "labels": torch.cat([torch.full((n + 2,), IGNORE)] * images + [text])}
        if images:
            dim = v.in_channels * v.temporal_patch_size * v.patch_size**2
            sample["pixel_values"] = torch.randn(images * h * w, dim, generator=gen)
            sample["image_grid_thw"] = torch.tensor([[1, h, w]] * images)
        return sample
    v = cfg.vision_config
    t = cfg.mm_tokens_per_image
    block = torch.cat([torch.tensor([cfg.boi_token_index]), torch.full((t,), cfg.image_token_id),
                       torch.tensor([cfg.eoi_token_index])])
    sample = {"input_ids": torch.cat([text[:1]] + [block] * images + [text[1:]]),
              "labels": torch.cat([text[:1]] + [torch.full((t + 2,), IGNORE)] * images + [text[1:]])}
    if images:
        sample["pixel_values"] = torch.randn(images, v.num_channels, v.image_size, v.image_size, generator=gen)
    return sample
