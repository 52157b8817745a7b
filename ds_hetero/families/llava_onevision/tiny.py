"""A tiny LLaVA-OneVision from config, seeded random weights; no download."""

from __future__ import annotations

import torch


def tiny_llava_onevision(seed: int = 0, text_hidden: int = 64, text_layers: int = 2, vision_hidden: int = 32,
                         vision_layers: int = 2, image_size: int = 16, patch_size: int = 4):
    """A LLaVA-OneVision (SigLIP + Qwen2) with a 300-token vocab: 16-px tiles of 4x4 patches, any-resolution
    grids up to 2x2 tiles, the last layer's features ("full": SigLIP has no CLS token)."""
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

    text = dict(
        model_type="qwen2", vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden,
        num_hidden_layers=text_layers, num_attention_heads=4, num_key_value_heads=2, bos_token_id=0,
        eos_token_id=1, pad_token_id=0, tie_word_embeddings=False, max_position_embeddings=1024,
    )
    vision = dict(
        model_type="siglip_vision_model", hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
        num_hidden_layers=vision_layers, num_attention_heads=4, image_size=image_size, patch_size=patch_size,
        vision_use_head=False,
    )
    t = image_size
    pinpoints = [[t, t], [t, 2 * t], [2 * t, t], [2 * t, 2 * t]]
    cfg = LlavaOnevisionConfig(text_config=text, vision_config=vision, image_token_index=299, video_token_index=298,
                               image_grid_pinpoints=pinpoints, vision_feature_layer=-1,
                               vision_feature_select_strategy="full", tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlavaOnevisionForConditionalGeneration(cfg)
