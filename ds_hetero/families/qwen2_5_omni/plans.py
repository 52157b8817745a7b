"""The Qwen2.5-Omni thinker's tensor-parallel plans: its own classes for the Qwen2 decoder, the windowed
vision tower (separate q/k/v; gated MLP; merger) and the audio encoder (Whisper-like: q/k/v column, out row;
the layer's own fc1 column, fc2 row)."""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan, attr_heads
from ..shared_plans import GATE_UP_DOWN, QKV_O

_HF = "transformers.models."

TP_PLANS = {
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniAttention": ShardPlan(**QKV_O),
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2MLP": GATE_UP_DOWN,
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniVisionAttention": ShardPlan(
        column=("q", "k", "v"), row=("proj",), heads=attr_heads, head_attrs=("num_heads",)),
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniMLP": GATE_UP_DOWN,
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniPatchMerger": ShardPlan(
        column=("mlp.0",), row=("mlp.2",), entry="mlp"),
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniAudioAttention": ShardPlan(
        column=("q_proj", "k_proj", "v_proj"), row=("out_proj",), heads=attr_heads, head_attrs=("num_heads",)),
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniAudioEncoderLayer": ShardPlan(
        column=("fc1",), row=("fc2",), entry="fc1"),
}
