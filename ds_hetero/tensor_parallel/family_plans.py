"""Tensor-parallel plans of the newer model families (Qwen2.5-VL, Qwen3-VL, InternVL, LLaVA-OneVision,
Gemma 3), merged into plans.PLANS.

Kept apart from plans.py so a family's entries can be read (and added) on their own; the
ShardPlan vocabulary is plans.py's.

    Qwen2.5-VL  vision: fused qkv [3 * heads * head_dim] split per segment (stride 3), proj row;
                the gated MLP (gate/up column, down row, with biases); the merger's mlp.0 column,
                mlp.2 row (its RMSNorm ln_q replicated, before the region). Text: as Qwen2-VL.
    Qwen3-VL    vision: fused qkv (stride 3), proj row; fc1 column, fc2 row; the merger and each
                DeepStack merger: LayerNorm replicated, linear_fc1 column, linear_fc2 row. Text:
                q/k/v column, o row (q_norm / k_norm per head, summed over tp as Gemma 3's); MLP.
    InternVL    vision: q/k/v column, projection_layer row (embed_dim made local: the forward
                reshapes by it); fc1 column, fc2 row; projector: LayerNorm replicated, linear_1
                column, linear_2 row. Text: Qwen2 / Llama (plans.py).
    OneVision   vision: SigLIP (plans.py); projector linear_1 column, linear_2 row. Text: Qwen2.
    Gemma 3     vision: SigLIP (plans.py); the projector (a bare weight after pooling and an
                RMSNorm) stays replicated. Text: q/k/v column by heads / kv heads, o row; gate/up/down.
                q_norm / k_norm are one head_dim weight applied to every head: replicated,
                each tp rank's gradient covers its heads only, so it is summed over tp.
"""

from __future__ import annotations

_HF = "transformers.models."


def family_plans(shard_plan, config_heads, attr_heads) -> dict:
    """The entries, built with plans.py's ShardPlan and head readers (passed in: no import cycle)."""
    qkv_o = dict(column=("q_proj", "k_proj", "v_proj"), row=("o_proj",), heads=config_heads)
    gate_up_down = shard_plan(column=("gate_proj", "up_proj"), row=("down_proj",))
    q25 = _HF + "qwen2_5_vl.modeling_qwen2_5_vl:"
    g3 = _HF + "gemma3.modeling_gemma3:"
    q3 = _HF + "qwen3_vl.modeling_qwen3_vl:"
    q3m = _HF + "qwen3_vl_moe.modeling_qwen3_vl_moe:"  # as Qwen3-VL; its MoE blocks by ep (expert_parallel/)
    iv = _HF + "internvl.modeling_internvl:"
    ov = _HF + "llava_onevision.modeling_llava_onevision:"
    return {
        q25 + "Qwen2_5_VLAttention": shard_plan(head_attrs=("num_heads", "num_key_value_heads"), **qkv_o),
        q25 + "Qwen2MLP": gate_up_down,
        q25 + "Qwen2_5_VLVisionAttention": shard_plan(
            column=("qkv",), row=("proj",), heads=attr_heads, head_attrs=("num_heads",), stride=3),
        q25 + "Qwen2_5_VLMLP": gate_up_down,
        q25 + "Qwen2_5_VLPatchMerger": shard_plan(column=("mlp.0",), row=("mlp.2",), entry="mlp"),
        q3 + "Qwen3VLTextAttention": shard_plan(per_head=("q_norm", "k_norm"), **qkv_o),
        q3 + "Qwen3VLTextMLP": gate_up_down,
        q3 + "Qwen3VLVisionAttention": shard_plan(
            column=("qkv",), row=("proj",), heads=attr_heads, head_attrs=("num_heads",), stride=3),
        q3 + "Qwen3VLVisionMLP": shard_plan(column=("linear_fc1",), row=("linear_fc2",)),
        # the merger and every DeepStack merger: norm replicated, then fc1 column, fc2 row
        q3 + "Qwen3VLVisionPatchMerger": shard_plan(column=("linear_fc1",), row=("linear_fc2",), entry="linear_fc1"),
        q3m + "Qwen3VLMoeTextAttention": shard_plan(per_head=("q_norm", "k_norm"), **qkv_o),
        q3m + "Qwen3VLMoeTextMLP": gate_up_down,
        q3m + "Qwen3VLMoeVisionAttention": shard_plan(
            column=("qkv",), row=("proj",), heads=attr_heads, head_attrs=("num_heads",), stride=3),
        q3m + "Qwen3VLMoeVisionMLP": shard_plan(column=("linear_fc1",), row=("linear_fc2",)),
        q3m + "Qwen3VLMoeVisionPatchMerger": shard_plan(column=("linear_fc1",), row=("linear_fc2",),
                                                        entry="linear_fc1"),
        iv + "InternVLVisionAttention": shard_plan(
            column=("q_proj", "k_proj", "v_proj"), row=("projection_layer",), heads=attr_heads,
            head_attrs=("num_heads", "embed_dim")),
        iv + "InternVLVisionMLP": shard_plan(column=("fc1",), row=("fc2",)),
        iv + "InternVLMultiModalProjector": shard_plan(column=("linear_1",), row=("linear_2",), entry="linear_1"),
        ov + "LlavaOnevisionMultiModalProjector": shard_plan(column=("linear_1",), row=("linear_2",)),
        g3 + "Gemma3Attention": shard_plan(per_head=("q_norm", "k_norm"), **qkv_o),
        g3 + "Gemma3MLP": gate_up_down,
    }
