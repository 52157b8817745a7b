"""A tiny Qwen3.5-MoE from config, seeded random weights; no download."""

from __future__ import annotations

import torch

from ..qwen2_vl.tiny import QWEN_SPECIAL_IDS
from ..qwen3_5.tiny import tiny_qwen3_5_configs


def tiny_qwen3_5_moe(seed: int = 0, text_hidden: int = 64, text_layers: int = 4, vision_hidden: int = 32,
                     vision_depth: int = 2, full_attention_interval: int = 4, num_experts: int = 8, top_k: int = 2,
                     shared_expert: int = 32, aux_coef: float = 0.05):
    """Qwen3.5's tiny decoder (tiny_qwen3_5: 3 Gated DeltaNet layers, 2 key and 4 value heads, then 1
    full-attention layer) with a MoE block in every layer, as in the released models: 8 experts, top-2,
    expert width a quarter of the hidden size (no square expert matrix), a shared expert of width
    `shared_expert` behind its sigmoid gate; the aux loss on with a visible coefficient (0.05)."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    text, vision = tiny_qwen3_5_configs(text_hidden, text_layers, vision_hidden, vision_depth,
                                        full_attention_interval, tie_word_embeddings=False)
    del text["intermediate_size"]  # no dense MLP: every layer is a MoE block
    text.update(num_experts=num_experts, num_experts_per_tok=top_k, moe_intermediate_size=text_hidden // 4,
                shared_expert_intermediate_size=shared_expert, output_router_logits=True,
                router_aux_loss_coef=aux_coef)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeConfig(
            text_config=text, vision_config=vision, tie_word_embeddings=False, **QWEN_SPECIAL_IDS))
