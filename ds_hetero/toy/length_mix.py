"""A seeded SFT-shaped length mix (pure): what the packing benchmark trains on and `ds-hetero plan
--lengths sft` prices.

Shaped like the public VLM SFT mixes (LLaVA mix665k, ShareGPT4V), scaled down by `scale`: 70% one
image (576 tokens / scale) + a text of lognormal(5.2, 0.8) tokens; 10% 2-4 images +
lognormal(5.0, 0.6); 20% text only, lognormal(6.4, 0.9) + 16; texts divided by the scale too,
every sample capped at 8192 / scale tokens.
"""

from __future__ import annotations

import random

IMAGE_TOKENS = 576  # one LLaVA image (CLIP ViT-L/14 at 336 px) in the language sequence


def sft_mix(n: int, scale: int = 1, seed: int = 0) -> list[tuple[int, int]]:
    """(images, text tokens) per sample of the scaled SFT mix."""
    rng = random.Random(seed)
    cap = 8192 // scale
    out = []
    for _ in range(n):
        u = rng.random()
        if u < 0.7:
            images, text = 1, rng.lognormvariate(5.2, 0.8)
        elif u < 0.8:
            images, text = rng.randint(2, 4), rng.lognormvariate(5.0, 0.6)
        else:
            images, text = 0, rng.lognormvariate(6.4, 0.9) + 16
        out.append((images, max(4, min(int(text / scale), cap - images * IMAGE_TOKENS // scale))))
    return out


def sft_lengths(n: int, scale: int = 1, seed: int = 0) -> list[int]:
    """Language tokens per sample of the mix: its images' placeholders plus its text."""
    return [images * (IMAGE_TOKENS // scale) + text for images, text in sft_mix(n, scale, seed)]
