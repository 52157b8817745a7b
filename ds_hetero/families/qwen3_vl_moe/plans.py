"""Qwen3-VL-MoE's tensor-parallel plans: Qwen3-VL's, for the classes of its own module. Vision: fused qkv
(stride 3), proj row; fc1 column, fc2 row; the mergers. Text: q/k/v column by heads, o row (q_norm / k_norm
per head); a dense MLP layer (`mlp_only_layers`) gate/up column, down row. The MoE blocks have no tp plan:
their router is replicated and their experts are sharded over ep (expert_parallel/)."""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan, attr_heads
from ..shared_plans import GATE_UP_DOWN, QKV_O

_M = "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe:"

TP_PLANS = {
    _M + "Qwen3VLMoeTextAttention": ShardPlan(per_head=("q_norm", "k_norm"), **QKV_O),
    _M + "Qwen3VLMoeTextMLP": GATE_UP_DOWN,
    _M + "Qwen3VLMoeVisionAttention": ShardPlan(
        column=("qkv",), row=("proj",), heads=attr_heads, head_attrs=("num_heads",), stride=3),
    _M + "Qwen3VLMoeVisionMLP": ShardPlan(column=("linear_fc1",), row=("linear_fc2",)),
    _M + "Qwen3VLMoeVisionPatchMerger": ShardPlan(column=("linear_fc1",), row=("linear_fc2",), entry="linear_fc1"),
}
