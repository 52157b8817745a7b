"""Qwen3.5's tensor-parallel plans: the Gated DeltaNet (linear-attention) layers sharded by heads, the
full-attention layers as Qwen3's, the gated MLP, and the Qwen3-VL-like vision tower.

Gated DeltaNet (`Qwen3_5GatedDeltaNet`), one tp region entered at the module (its input replicated):

    in_proj_qkv   column, segment by segment ("fused", widths key_dim | key_dim | value_dim): each
                  rank keeps its key heads' q and k rows and its value heads' v rows
    conv1d        depthwise over those same channels, split with the same segments: a depthwise
                  kernel mixes time within one channel, so each rank convolves only its own
                  channels and nothing is exchanged (tensor_parallel/channels.py)
    in_proj_z     column (the output gate, value_dim = value heads x head_v_dim)
    in_proj_b/_a  column (one beta and one decay input per value head)
    A_log, dt_bias  split with the value heads (one per value head)
    norm          per head (RMSNormGated over head_v_dim, applied to every head): replicated, its
                  gradient summed over tp, as Qwen3's q_norm / k_norm
    out_proj      row: the only reduction of the region

Why exact: every operation between the in-projections and out_proj is per head (the delta rule's
recurrence runs per value head over the sequence, the L2 norm of q and k is per head, the gated
norm is per head). Each key head serves `num_v_heads / num_k_heads` consecutive value heads
(`repeat_interleave`), so splitting key heads and value heads into tp contiguous blocks keeps every
value head with its key head on the same rank; tp must divide both head counts (checked).

Full attention (`Qwen3_5Attention`): q_proj holds each head's query and output gate side by side
([heads, 2 x head_dim]), so a contiguous column split keeps a head's gate with it; k/v column by kv
heads, o row; q_norm / k_norm per head.
"""

from __future__ import annotations

from ...tensor_parallel.shard_plans import ShardPlan, attr_heads
from ..shared_plans import GATE_UP_DOWN, QKV_O

def deltanet_heads(m) -> tuple[int, int]:
    return m.num_v_heads, m.num_k_heads


def deltanet_segments(m) -> tuple[int, int, int]:
    return m.key_dim, m.key_dim, m.value_dim  # q | k | v in in_proj_qkv's rows and conv1d's channels


GATED_DELTANET = ShardPlan(
    column=("in_proj_z", "in_proj_b", "in_proj_a"), row=("out_proj",), heads=deltanet_heads,
    head_names=("linear-attention value heads", "linear-attention key heads"),
    head_attrs=("num_v_heads", "num_k_heads", "key_dim", "value_dim", "conv_dim"),
    per_head=("norm",), fused=("in_proj_qkv", "conv1d"), segments=deltanet_segments, vectors=("A_log", "dt_bias"))


def qwen3_5_plans(module: str, prefix: str) -> dict:
    """The plans for the classes `prefix`* of transformers.models.`module`: Qwen3.5's own, and Qwen3.5-MoE's
    (the same Gated DeltaNet, attention and tower under its own names; its `MLP` is the MoE block's shared expert)."""
    m = f"transformers.models.{module}.modeling_{module}:{prefix}"
    return {
        m + "GatedDeltaNet": GATED_DELTANET,
        m + "Attention": ShardPlan(per_head=("q_norm", "k_norm"), **QKV_O),
        m + "MLP": GATE_UP_DOWN,
        m + "VisionAttention": ShardPlan(column=("qkv",), row=("proj",), heads=attr_heads, head_attrs=("num_heads",),
                                         stride=3),
        m + "VisionMLP": ShardPlan(column=("linear_fc1",), row=("linear_fc2",)),
        m + "VisionPatchMerger": ShardPlan(column=("linear_fc1",), row=("linear_fc2",), entry="linear_fc1"),
    }


TP_PLANS = qwen3_5_plans("qwen3_5", "Qwen3_5")
