"""A tiny dense Qwen3-VL (DeepStack) from config, seeded random weights; no download."""

from __future__ import annotations

import torch

from ..qwen2_vl.tiny import QWEN_SPECIAL_IDS


def tiny_qwen3_vl_configs(text_hidden: int, text_layers: int, vision_hidden: int, vision_depth: int,
                          deepstack_visual_indexes) -> tuple[dict, dict]:
    """The tiny Qwen3-VL's text and vision config dicts (Qwen3-VL-MoE's tiny model adds its experts to
    the text one)."""
    text = dict(
        vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=text_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=text_hidden // 4, bos_token_id=0, eos_token_id=1,
        pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                         "mrope_interleaved": True},
    )
    vision = dict(
        depth=vision_depth, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_heads=4,
        out_hidden_size=text_hidden, patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        num_position_embeddings=16, deepstack_visual_indexes=list(deepstack_visual_indexes),
    )
    return text, vision


def tiny_qwen3_vl(seed: int = 0, text_hidden: int = 64, text_layers: int = 3, vision_hidden: int = 32,
                  vision_depth: int = 3, deepstack_visual_indexes=(0, 1)):
    """A dense Qwen3-VL with a 300-token vocab; DeepStack levels from vision blocks 0 and 1 go into
    decoder layers 0 and 1 (of 3); 4-px patches, 2x2 merge, a 4x4 learned position grid."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    text, vision = tiny_qwen3_vl_configs(text_hidden, text_layers, vision_hidden, vision_depth,
                                         deepstack_visual_indexes)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision,
                                                             **QWEN_SPECIAL_IDS))
