"""Model classes ds_hetero knows and refuses, each with the reason (what `adapter_for` says)."""

from __future__ import annotations

from types import MappingProxyType

# Qwen3VLMoeForConditionalGeneration, refused here until expert parallelism was built, has its
# family home (families/qwen3_vl_moe/).
REFUSED = MappingProxyType({
    "Gemma4ForConditionalGeneration": (
        "ds_hetero has no Gemma 4 adapter yet. It needs: its vision tower (padded patch positions, "
        "pooling) and its conformer audio tower as two encoder stages with tp plans (the towers wrap their "
        "linears in clippable linears; the audio layers hold a depthwise conv); its decoder's per-layer "
        "embeddings (hidden_size_per_layer_input) handed to every pipeline chunk; plans for layers that "
        "share another layer's keys and values (num_kv_shared_layers: no k/v projections) or reuse k as v "
        "(attention_k_eq_v); and, with enable_moe_block, its MoE block wired to expert parallelism "
        "(expert_parallel/ serves Qwen3-VL-MoE's fused experts; Gemma 4's block is not wired yet)"),
})


def refusal(class_name: str) -> str:
    return f"ds_hetero refuses {class_name}: {REFUSED[class_name]}"
