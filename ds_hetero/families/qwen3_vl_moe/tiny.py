"""A tiny Qwen3-VL-MoE (DeepStack, a mixture-of-experts decoder) from config, seeded random weights; no download."""

from __future__ import annotations

import torch

from ..qwen2_vl.tiny import QWEN_SPECIAL_IDS
from ..qwen3_vl.tiny import tiny_qwen3_vl_configs


def tiny_qwen3_vl_moe(seed: int = 0, text_hidden: int = 64, text_layers: int = 3, vision_hidden: int = 32,
                      vision_depth: int = 3, deepstack_visual_indexes=(0, 1), num_experts: int = 8, top_k: int = 2,
                      mlp_only_layers=(), aux_coef: float = 0.05):
    """A Qwen3-VL-MoE with a 300-token vocab: 8 experts, top-2, every decoder layer a MoE block
    (`mlp_only_layers` keeps some dense), the aux loss on with a visible coefficient (0.05);
    expert width a quarter of the hidden size (no square expert matrix): transformers stores fused experts transposed and, loading,
    transposes back only where the shapes differ (a square expert would come back untransposed);
    DeepStack levels from vision blocks 0 and 1 into decoder layers 0 and 1 (of 3)."""
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    text, vision = tiny_qwen3_vl_configs(text_hidden, text_layers, vision_hidden, vision_depth,
                                         deepstack_visual_indexes)
    text.update(num_experts=num_experts, num_experts_per_tok=top_k, moe_intermediate_size=text_hidden // 4,
                decoder_sparse_step=1, mlp_only_layers=list(mlp_only_layers), output_router_logits=True,
                router_aux_loss_coef=aux_coef, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3VLMoeForConditionalGeneration(Qwen3VLMoeConfig(text_config=text, vision_config=vision,
                                                                   tie_word_embeddings=False, **QWEN_SPECIAL_IDS))
