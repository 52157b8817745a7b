"""A tiny Gemma 3 from config, seeded random weights: pools a 4x4 patch grid to 4 tokens per image and
mixes sliding-window (window 4) and full-attention layers. No download."""

from __future__ import annotations

import torch


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
