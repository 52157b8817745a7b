"""InternVL's tensor-parallel plans. Vision: q/k/v column, projection_layer row (embed_dim made local: the
forward reshapes by it); fc1 column, fc2 row; projector: LayerNorm replicated, linear_1 column, linear_2 row.
Text: its Qwen2 / Llama decoder (families/shared_plans.py)."""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan, attr_heads

_HF = "transformers.models."

TP_PLANS = {
    _HF + "internvl.modeling_internvl:InternVLVisionAttention": ShardPlan(
        column=("q_proj", "k_proj", "v_proj"), row=("projection_layer",), heads=attr_heads,
        head_attrs=("num_heads", "embed_dim")),
    _HF + "internvl.modeling_internvl:InternVLVisionMLP": ShardPlan(column=("fc1",), row=("fc2",)),
    _HF + "internvl.modeling_internvl:InternVLMultiModalProjector": ShardPlan(
        column=("linear_1",), row=("linear_2",), entry="linear_1"),
}
