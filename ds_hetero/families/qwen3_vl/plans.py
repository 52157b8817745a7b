"""Qwen3-VL's tensor-parallel plans. Vision: fused qkv (stride 3), proj row; fc1 column, fc2 row; the merger
and each DeepStack merger: LayerNorm replicated, linear_fc1 column, linear_fc2 row. Text: q/k/v column, o row
(q_norm / k_norm per head, summed over tp as Gemma 3's); the gated MLP."""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan, attr_heads
from ..shared_plans import GATE_UP_DOWN, QKV_O

_HF = "transformers.models."

TP_PLANS = {
    _HF + "qwen3_vl.modeling_qwen3_vl:Qwen3VLTextAttention": ShardPlan(per_head=("q_norm", "k_norm"), **QKV_O),
    _HF + "qwen3_vl.modeling_qwen3_vl:Qwen3VLTextMLP": GATE_UP_DOWN,
    _HF + "qwen3_vl.modeling_qwen3_vl:Qwen3VLVisionAttention": ShardPlan(
        column=("qkv",), row=("proj",), heads=attr_heads, head_attrs=("num_heads",), stride=3),
    _HF + "qwen3_vl.modeling_qwen3_vl:Qwen3VLVisionMLP": ShardPlan(column=("linear_fc1",), row=("linear_fc2",)),
    # the merger and every DeepStack merger: norm replicated, then fc1 column, fc2 row
    _HF + "qwen3_vl.modeling_qwen3_vl:Qwen3VLVisionPatchMerger": ShardPlan(
        column=("linear_fc1",), row=("linear_fc2",), entry="linear_fc1"),
}
