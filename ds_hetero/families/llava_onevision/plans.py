"""LLaVA-OneVision's tensor-parallel plan: the projector (linear_1 column, linear_2 row). Its SigLIP tower
and Qwen2 decoder are in families/shared_plans.py."""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan

_HF = "transformers.models."

TP_PLANS = {
    _HF + "llava_onevision.modeling_llava_onevision:LlavaOnevisionMultiModalProjector": ShardPlan(
        column=("linear_1",), row=("linear_2",)),
}
