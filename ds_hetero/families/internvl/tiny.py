"""A tiny InternVL from config, seeded random weights; no download."""

from __future__ import annotations

import torch


INTERNVL_IDS = dict(image_token_id=299)  # <IMG_CONTEXT>; <img> 297 and </img> 296 are text tokens


def tiny_internvl(seed: int = 0, text_hidden: int = 64, text_layers: int = 2, vision_hidden: int = 32,
                  vision_layers: int = 2, image_size: int = 16, patch_size: int = 4):
    """An InternVL (InternViT + Qwen2) with a 300-token vocab: a 16-px tile is 4x4 patches (+ CLS),
    pixel shuffle 0.5 folds them into 4 tokens per tile."""
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    text = dict(
        model_type="qwen2", vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden,
        num_hidden_layers=text_layers, num_attention_heads=4, num_key_value_heads=2, bos_token_id=0,
        eos_token_id=1, pad_token_id=0, tie_word_embeddings=False, max_position_embeddings=1024,
    )
    vision = dict(
        hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=vision_layers,
        num_attention_heads=4, image_size=[image_size, image_size], patch_size=[patch_size, patch_size],
    )
    tokens = (image_size // patch_size) ** 2 // 4
    cfg = InternVLConfig(text_config=text, vision_config=vision, image_seq_length=tokens, downsample_ratio=0.5,
                         tie_word_embeddings=False, **INTERNVL_IDS)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = InternVLForConditionalGeneration(cfg)
        with torch.no_grad():  # InternViT starts its CLS token and positions at zero: draw them too
            emb = model.model.vision_tower.embeddings
            emb.cls_token.normal_(0.0, 0.2)
            if getattr(emb, "position_embeddings", None) is not None:
                emb.position_embeddings.normal_(0.0, 0.2)
        return model
