"""A tiny LLaVA (CLIP or SigLIP tower + Llama) from config, seeded random weights; no download."""

from __future__ import annotations

import torch


LLAVA_IMAGE_TOKEN = 255  # last id of the default 256-token vocab


def tiny_llava(
    vision: str = "clip",
    seed: int = 0,
    text_hidden: int = 64,
    text_layers: int = 2,
    text_heads: int = 4,
    text_kv_heads: int = 2,
    vocab: int = 256,
    vision_hidden: int = 32,
    vision_layers: int = 2,
    vision_heads: int = 4,
    image_size: int = 32,
    patch_size: int = 8,
    tie_word_embeddings: bool = False,
):
    """A LLaVA with a CLIP or SigLIP tower; (image_size / patch_size)^2 tokens per image.

    `tie_word_embeddings`: the output head shares the input embedding's weight."""
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              SiglipVisionConfig)

    text = LlamaConfig(
        vocab_size=vocab, hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=text_layers,
        num_attention_heads=text_heads, num_key_value_heads=text_kv_heads, max_position_embeddings=1024,
    )
    vision_kwargs = dict(
        hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=vision_layers,
        num_attention_heads=vision_heads, image_size=image_size, patch_size=patch_size,
    )
    if vision == "clip":
        vision_cfg, strategy = CLIPVisionConfig(**vision_kwargs), "default"  # drops CLS
    elif vision == "siglip":
        vision_cfg, strategy = SiglipVisionConfig(**vision_kwargs), "full"  # no CLS token
    else:
        raise ValueError(f"vision must be 'clip' or 'siglip', got {vision!r}")
    cfg = LlavaConfig(
        vision_config=vision_cfg, text_config=text, image_token_id=vocab - 1,
        vision_feature_select_strategy=strategy, tie_word_embeddings=tie_word_embeddings,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlavaForConditionalGeneration(cfg)


def llava_tokens_per_image(model) -> int:
    v = model.config.vision_config
    return (v.image_size // v.patch_size) ** 2
