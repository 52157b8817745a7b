"""A tiny Qwen2.5-Omni thinker (vision and audio towers) from config, seeded random weights; no download."""

from __future__ import annotations

import torch

from ..qwen2_vl.tiny import QWEN_SPECIAL_IDS


OMNI_SPECIAL_IDS = dict(image_token_index=299, video_token_index=298, audio_token_index=297, audio_start_token_id=296,
                        audio_end_token_id=295, vision_start_token_id=294, vision_end_token_id=293)


def tiny_qwen2_5_omni(seed: int = 0, text_hidden: int = 64, text_layers: int = 2, vision_hidden: int = 32,
                      vision_depth: int = 2, audio_hidden: int = 32, audio_layers: int = 2, n_mel: int = 16):
    """A Qwen2.5-Omni thinker: a 4x4-patch image (16 px side) gives 4 image tokens, a clip of F mel
    frames gives ((F - 1) // 2 + 1 - 2) // 2 + 1 audio tokens (20 frames: 5). Untied head (a
    vocabulary-parallel head needs it)."""
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    half = text_hidden // 4 // 2  # rotary pairs per head (4 heads): split over time, height, width
    section = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    text = dict(vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden,
                num_hidden_layers=text_layers, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section})
    vision = dict(depth=vision_depth, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_heads=4,
                  patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3, window_size=16,
                  out_hidden_size=text_hidden, fullatt_block_indexes=[vision_depth - 1])
    audio = dict(num_mel_bins=n_mel, encoder_layers=audio_layers, encoder_attention_heads=4,
                 encoder_ffn_dim=2 * audio_hidden, d_model=audio_hidden, output_dim=text_hidden, n_window=4,
                 max_source_positions=64)
    cfg = Qwen2_5OmniThinkerConfig(text_config=text, vision_config=vision, audio_config=audio,
                                   tie_word_embeddings=False, **OMNI_SPECIAL_IDS)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen2_5OmniThinkerForConditionalGeneration(cfg)
