"""Qwen2.5-VL's tensor-parallel plans. Vision: fused qkv [3 * heads * head_dim] split per segment (stride
3), proj row; the gated MLP (gate/up column, down row, with biases); the merger's mlp.0 column, mlp.2 row (its
RMSNorm ln_q replicated, before the region). Text: as Qwen2-VL."""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan, attr_heads
from ..shared_plans import GATE_UP_DOWN, QKV_O

_HF = "transformers.models."

TP_PLANS = {
    _HF + "qwen2_5_vl.modeling_qwen2_5_vl:Qwen2_5_VLAttention": ShardPlan(
        head_attrs=("num_heads", "num_key_value_heads"), **QKV_O),
    _HF + "qwen2_5_vl.modeling_qwen2_5_vl:Qwen2MLP": GATE_UP_DOWN,
    _HF + "qwen2_5_vl.modeling_qwen2_5_vl:Qwen2_5_VLVisionAttention": ShardPlan(
        column=("qkv",), row=("proj",), heads=attr_heads, head_attrs=("num_heads",), stride=3),
    _HF + "qwen2_5_vl.modeling_qwen2_5_vl:Qwen2_5_VLMLP": GATE_UP_DOWN,
    _HF + "qwen2_5_vl.modeling_qwen2_5_vl:Qwen2_5_VLPatchMerger": ShardPlan(column=("mlp.0",), row=("mlp.2",), entry="mlp"),
}
