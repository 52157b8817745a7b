"""A tiny dense Qwen3.5 from config, seeded random weights; no download."""

from __future__ import annotations

import torch

from ..qwen2_vl.tiny import QWEN_SPECIAL_IDS


def tiny_qwen3_5(seed: int = 0, text_hidden: int = 64, text_layers: int = 4, vision_hidden: int = 32,
                 vision_depth: int = 2, full_attention_interval: int = 4, tie_word_embeddings: bool = False):
    """A dense Qwen3.5 with a 300-token vocab and Qwen3.5's layer pattern: 3 Gated DeltaNet
    (linear-attention) layers, then 1 full-attention layer (`full_attention_interval` 4). The
    Gated DeltaNet layers have 2 key heads and 4 value heads (each key head serves 2 value heads,
    as in the released models), so a wrong head split is visible. 4-px patches, 2x2 merge, a 4x4
    learned position grid: a 16-px image gives 4 image tokens."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text, vision = tiny_qwen3_5_configs(text_hidden, text_layers, vision_hidden, vision_depth,
                                        full_attention_interval, tie_word_embeddings)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3_5ForConditionalGeneration(Qwen3_5Config(
            text_config=text, vision_config=vision, tie_word_embeddings=tie_word_embeddings, **QWEN_SPECIAL_IDS))


def tiny_qwen3_5_configs(text_hidden: int, text_layers: int, vision_hidden: int, vision_depth: int,
                         full_attention_interval: int, tie_word_embeddings: bool) -> tuple[dict, dict]:
    """(text config, vision config) keyword dicts of the tiny Qwen3.5 (the MoE family's tiny model adds its experts)."""
    text = dict(
        vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=text_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=text_hidden // 4, bos_token_id=0, eos_token_id=1,
        pad_token_id=0, full_attention_interval=full_attention_interval,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, tie_word_embeddings=tie_word_embeddings,
        # rotary over half of each 16-wide head: 8 dims, 4 frequencies split t/h/w as 2/1/1
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    )
    vision = dict(
        depth=vision_depth, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_heads=4,
        out_hidden_size=text_hidden, patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        num_position_embeddings=16,
    )
    return text, vision
