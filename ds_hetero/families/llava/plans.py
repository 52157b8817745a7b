"""LLaVA's tensor-parallel plan: the projector (linear_1 column, linear_2 row). Its towers (CLIP, SigLIP)
and decoders (Llama, Qwen2) are in families/shared_plans.py."""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan

_HF = "transformers.models."

TP_PLANS = {
    _HF + "llava.modeling_llava:LlavaMultiModalProjector": ShardPlan(column=("linear_1",), row=("linear_2",)),
}
