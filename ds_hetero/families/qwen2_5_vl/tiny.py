"""A tiny Qwen2.5-VL from config, seeded random weights: windowed blocks and a full-attention block (a
16-px window is 4x4 patches, so 8x8-patch images hold several windows). No download."""

from __future__ import annotations

import torch

from ..qwen2_vl.tiny import QWEN_SPECIAL_IDS


def tiny_qwen2_5_vl(seed: int = 0, text_hidden: int = 64, text_layers: int = 2, vision_hidden: int = 32,
                    vision_depth: int = 3, fullatt_block_indexes=(1,)):
    """A Qwen2.5-VL with a 300-token vocab; 4-px patches, 2x2 merge, 16-px attention windows."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(
        vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=text_layers,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1, pad_token_id=0,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},  # sums to head_dim / 2
    )
    vision = dict(
        depth=vision_depth, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_heads=4,
        out_hidden_size=text_hidden, patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        window_size=16, fullatt_block_indexes=list(fullatt_block_indexes),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                                                                   **QWEN_SPECIAL_IDS))
