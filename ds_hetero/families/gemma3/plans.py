"""Gemma 3's tensor-parallel plans. Vision: SigLIP (families/shared_plans.py); the projector (a bare weight
after pooling and an RMSNorm) stays replicated. Text: q/k/v column by heads / kv heads, o row; gate/up/down.
q_norm / k_norm are one head_dim weight applied to every head: replicated, each tp rank's gradient covers its
heads only, so it is summed over tp."""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan
from ..shared_plans import GATE_UP_DOWN, QKV_O

_HF = "transformers.models."

TP_PLANS = {
    _HF + "gemma3.modeling_gemma3:Gemma3Attention": ShardPlan(per_head=("q_norm", "k_norm"), **QKV_O),
    _HF + "gemma3.modeling_gemma3:Gemma3MLP": GATE_UP_DOWN,
}
