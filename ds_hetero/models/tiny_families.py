"""Tiny Qwen2.5-VL and Gemma 3 built from transformers' own config classes, seeded random weights.

No download. Small enough for multi-process CPU parity tests, yet every family mechanism is
exercised: Qwen2.5-VL has windowed blocks and a full-attention block (a 16-px window is 4x4
patches, so 8x8-patch images hold several windows); Gemma 3 pools a 4x4 patch grid to 4 tokens
per image and mixes sliding-window (window 4) and full-attention layers.
"""

from __future__ import annotations

import torch

from .tiny import QWEN_SPECIAL_IDS


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


def tiny_qwen3_vl(seed: int = 0, text_hidden: int = 64, text_layers: int = 3, vision_hidden: int = 32,
                  vision_depth: int = 3, deepstack_visual_indexes=(0, 1)):
    """A dense Qwen3-VL with a 300-token vocab; DeepStack levels from vision blocks 0 and 1 go into
    decoder layers 0 and 1 (of 3); 4-px patches, 2x2 merge, a 4x4 learned position grid."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

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
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision,
                                                             **QWEN_SPECIAL_IDS))


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


GEMMA3_IDS = dict(boi_token_index=297, eoi_token_index=296, image_token_index=299)


def tiny_gemma3(seed: int = 0, text_hidden: int = 64, text_layers: int = 3, vision_hidden: int = 32,
                vision_layers: int = 2, image_size: int = 16, patch_size: int = 4, tokens_per_image: int = 4,
                sliding_window: int = 4, tie_word_embeddings: bool = False):
    """A Gemma 3 with a 300-token vocab, untied head unless `tie_word_embeddings` (Gemma's own
    default); layers alternate sliding (window 4) and full.

    Gemma initialises its projection weight and its (1 + w) RMSNorm weights to zero; here they
    are drawn at random too, so the image rows and every norm carry a gradient from step one.
    """
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(text_layers)]
    text = dict(
        vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=text_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=text_hidden // 4, query_pre_attn_scalar=text_hidden // 4,
        sliding_window=sliding_window, layer_types=layer_types, max_position_embeddings=1024,
        pad_token_id=0, bos_token_id=2, eos_token_id=1, tie_word_embeddings=tie_word_embeddings,
    )
    vision = dict(
        hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=vision_layers,
        num_attention_heads=4, image_size=image_size, patch_size=patch_size, vision_use_head=False,
    )
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=tokens_per_image,
                       tie_word_embeddings=tie_word_embeddings, **GEMMA3_IDS)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Gemma3ForConditionalGeneration(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("mm_input_projection_weight") or ("norm" in name and "vision_tower" not in name):
                    p.normal_(0.0, 0.1 if "norm" in name else 0.2)
        return model
