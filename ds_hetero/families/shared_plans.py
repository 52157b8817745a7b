"""Tensor-parallel plans of the Hugging Face decoders and towers several families are built from
(Llama and Qwen2 decoders, CLIP and SigLIP towers): a LLaVA may carry any of them, InternVL and
LLaVA-OneVision a Qwen2 decoder. The family registry merges these with every family's own.

    decoders  q/k/v column (GQA: k and v by kv heads), o row; gate/up column, down row
    towers    q/k/v column, out row; fc1 column, fc2 row
"""

from __future__ import annotations

from ..tensor_parallel.shard_plans import ShardPlan, attr_heads, config_heads

_HF = "transformers.models."
# k_proj and v_proj hold kv_heads * head_dim rows: kv heads divisible by tp keeps GQA groups whole
QKV_O = dict(column=("q_proj", "k_proj", "v_proj"), row=("o_proj",), heads=config_heads)
GATE_UP_DOWN = ShardPlan(column=("gate_proj", "up_proj"), row=("down_proj",))
FC1_FC2 = ShardPlan(column=("fc1",), row=("fc2",))

TP_PLANS = {
    _HF + "llama.modeling_llama:LlamaAttention": ShardPlan(**QKV_O),
    _HF + "llama.modeling_llama:LlamaMLP": GATE_UP_DOWN,
    _HF + "qwen2.modeling_qwen2:Qwen2Attention": ShardPlan(**QKV_O),
    _HF + "qwen2.modeling_qwen2:Qwen2MLP": GATE_UP_DOWN,
    _HF + "clip.modeling_clip:CLIPAttention": ShardPlan(
        column=("q_proj", "k_proj", "v_proj"), row=("out_proj",), heads=attr_heads, head_attrs=("num_heads",)),
    _HF + "clip.modeling_clip:CLIPMLP": FC1_FC2,
    _HF + "siglip.modeling_siglip:SiglipAttention": ShardPlan(
        column=("q_proj", "k_proj", "v_proj"), row=("out_proj",), heads=attr_heads, head_attrs=("num_heads",)),
    _HF + "siglip.modeling_siglip:SiglipMLP": FC1_FC2,
}
