"""Qwen2-VL's tensor-parallel plans. Text: q/k/v column, o row (its attention reads the head counts as
attributes), the gated MLP. Vision: the fused qkv [3 * heads * head_dim] split per segment (stride 3), proj
row; fc1 column, fc2 row; the merger MLP."""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan, attr_heads
from ..shared_plans import GATE_UP_DOWN, QKV_O

_HF = "transformers.models."

TP_PLANS = {
    _HF + "qwen2_vl.modeling_qwen2_vl:Qwen2VLAttention": ShardPlan(
        head_attrs=("num_heads", "num_key_value_heads"), **QKV_O),
    _HF + "qwen2_vl.modeling_qwen2_vl:Qwen2MLP": GATE_UP_DOWN,
    _HF + "qwen2_vl.modeling_qwen2_vl:VisionAttention": ShardPlan(
        column=("qkv",), row=("proj",), heads=attr_heads, head_attrs=("num_heads",), stride=3),
    _HF + "qwen2_vl.modeling_qwen2_vl:VisionMlp": ShardPlan(column=("fc1",), row=("fc2",)),
    _HF + "qwen2_vl.modeling_qwen2_vl:PatchMerger": ShardPlan(column=("mlp.0",), row=("mlp.2",), entry="mlp"),
}
