"""A tiny Qwen3-VL-MoE (DeepStack, a mixture-of-experts decoder) from config, seeded random weights; no download."""

from __future__ import annotations

import torch

from ..qwen2_vl.tiny import QWEN_SPECIAL_IDS


def tiny_qwen3_vl_moe(seed: int = 0, text_hidden: int = 64, text_layers: int = 3, vision_hidden: int = 32,
                      vision_depth: int = 3, deepstack_visual_indexes=(0, 1), num_experts: int = 8, top_k: int = 2,
                      mlp_only_layers=(), aux_coef: float = 0.05):
    """A Qwen3-VL-MoE with a 300-token vocab: 8 experts, top-2, every decoder layer a MoE block
    (`mlp_only_layers` keeps some dense), the aux loss on with a visible coefficient (0.05);
    expert width a quarter of the hidden size (no square expert matrix): transformers stores fused experts transposed and, loading,
    transposes back only where the shapes differ (a square expert would come back untransposed);
    DeepStack levels from vision blocks 0 and 1 into decoder layers 0 and 1 (of 3)."""
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    text = dict(
        vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=text_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=text_hidden // 4, bos_token_id=0, eos_token_id=1,
        pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                         "mrope_interleaved": True},
        num_experts=num_experts, num_experts_per_tok=top_k, moe_intermediate_size=text_hidden // 4,
        decoder_sparse_step=1, mlp_only_layers=list(mlp_only_layers), output_router_logits=True,
        router_aux_loss_coef=aux_coef, tie_word_embeddings=False,
    )
    vision = dict(
        depth=vision_depth, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_heads=4,
        out_hidden_size=text_hidden, patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        num_position_embeddings=16, deepstack_visual_indexes=list(deepstack_visual_indexes),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3VLMoeForConditionalGeneration(Qwen3VLMoeConfig(text_config=text, vision_config=vision,
                                                                   tie_word_embeddings=False, **QWEN_SPECIAL_IDS))
