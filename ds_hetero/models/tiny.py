"""Small Hugging Face multimodal models built from config with seeded random weights.

No download: tests, benchmarks and the CPU training job build these. Sizes are arguments so a
benchmark can make the vision tower carry real weight.
"""

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


# Qwen2.5-Omni placeholder and delimiter ids at the top of a 300-token vocabulary
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
