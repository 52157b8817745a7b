"""Gemma 4's tensor-parallel plans, one region per attention or MLP block, by heads.

Text attention: q/k/v column by heads and kv heads, o row; q_norm / k_norm (one head_dim weight for
every head) replicated with their gradients summed over tp (`per_head`). Its instances differ by layer:
full-attention layers have their own head_dim and kv-head count (`per_layer_config`: the kv heads are
read from the layer, `num_attention_heads // num_key_value_groups`); a layer with `attention_k_eq_v`
has no v_proj (its values are its keys: each rank's own kv heads); a kv-shared layer
(`num_kv_shared_layers`) has no k_proj, v_proj or k_norm and reads the keys and values the last earlier
layer of its type stored, which over tp are this rank's kv heads, paired with this rank's query heads,
so nothing is exchanged (`optional`: the children an instance may lack). The dense MLP gate/up column,
down row. The MoE block (router, experts) and the per-layer-input gate and projection stay replicated
(tp ranks compute them on the same replicated hidden states); its experts are sharded over ep instead.

Vision: the clippable linears' inner `.linear` are split (q/k/v column, o row; gate/up column, down row):
a clamp on a column output acts elementwise on each rank's features, and the row-parallel linear sums
its partial outputs before the output clamp (RowParallelLinear reduces inside its forward), so every
clamp acts on the values the unsharded model clamps.

Audio (conformer): attention q/k/v and `relative_k_proj` (the relative-position keys, per head) column,
`post` row, `num_heads` made local, `per_dim_scale` (one head_dim vector for every head) summed over tp;
each feed-forward is a region entered at `ffw_layer_1` (the block's input is also its residual, which
must not be summed over tp), `ffw_layer_2` row. The light conv block stays replicated: its RMSNorm after
the depthwise conv normalises over all channels, so a channel split would need the full width there.
"""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan, attr_heads, config_heads
from ..shared_plans import GATE_UP_DOWN

_M = "transformers.models.gemma4.modeling_gemma4:"


def text_heads(m) -> tuple[int, int]:
    """(query heads, this layer's kv heads): full layers may have their own kv-head count."""
    heads = m.config.num_attention_heads
    return heads, heads // m.num_key_value_groups


TEXT_ATTENTION = ShardPlan(column=("q_proj", "k_proj", "v_proj"), row=("o_proj",), heads=text_heads,
                           per_head=("q_norm", "k_norm"), optional=("k_proj", "v_proj", "k_norm"))

TP_PLANS = {
    _M + "Gemma4TextAttention": TEXT_ATTENTION,
    _M + "Gemma4TextMLP": GATE_UP_DOWN,
    _M + "Gemma4VisionAttention": ShardPlan(
        column=("q_proj.linear", "k_proj.linear", "v_proj.linear"), row=("o_proj.linear",), heads=config_heads,
        per_head=("q_norm", "k_norm")),
    _M + "Gemma4VisionMLP": ShardPlan(column=("gate_proj.linear", "up_proj.linear"), row=("down_proj.linear",)),
    _M + "Gemma4AudioAttention": ShardPlan(
        column=("q_proj.linear", "k_proj.linear", "v_proj.linear", "relative_k_proj"), row=("post.linear",),
        heads=attr_heads, head_attrs=("num_heads",), per_head=("per_dim_scale",)),
    _M + "Gemma4AudioFeedForward": ShardPlan(column=("ffw_layer_1.linear",), row=("ffw_layer_2.linear",),
                                             entry="ffw_layer_1"),
}
