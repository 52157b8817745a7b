"""A tiny Qwen2-VL from config, seeded random weights; no download. QWEN_SPECIAL_IDS are the
placeholder ids every tiny Qwen family shares."""

from __future__ import annotations

import torch


QWEN_SPECIAL_IDS = dict(image_token_id=299, video_token_id=298, vision_start_token_id=297, vision_end_token_id=296)


def tiny_qwen2_vl(seed: int = 0, text_hidden: int = 64, text_layers: int = 2, vision_embed: int = 32,
                  vision_depth: int = 2, tie_word_embeddings: bool = False):
    """A Qwen2-VL with a 300-token vocab; a 4x4-patch image (16 px side) gives 4 image tokens.

    `tie_word_embeddings`: the output head shares the input embedding's weight (as Qwen2-VL-2B)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(
        vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=text_layers,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1, pad_token_id=0,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},  # sums to head_dim / 2
    )
    vision = dict(
        depth=vision_depth, embed_dim=vision_embed, hidden_size=text_hidden, num_heads=4, patch_size=4,
        spatial_merge_size=2, temporal_patch_size=2, in_chans=3, mlp_ratio=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        cfg = Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie_word_embeddings,
                            **QWEN_SPECIAL_IDS)
        return Qwen2VLForConditionalGeneration(cfg)
