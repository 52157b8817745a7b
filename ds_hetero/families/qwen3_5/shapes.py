"""The planner's shapes of Qwen3.5 (dense), read from its Hugging Face config: Qwen3-VL's tower without
DeepStack, and a decoder of two layer types (`layer_types`): Gated DeltaNet (linear attention) and gated
full attention, 3 to 1.

The planner's records (models/shapes.py) describe a decoder of identical attention layers. `HybridLanguage`
keeps their fields for the full-attention layers' shapes (what flops.py, collectives.py and activations.py
read) and counts the parameters exactly, layer type by layer type: `params`, `replicated_params` and
`params_per_rank` equal the model's; `layer_params` (what a pipeline chunk is priced by) is their mean
per layer. Priced approximately: a Gated DeltaNet layer's work as a full-attention layer's (its
attention's FLOPs and activation memory grow with the square of the sequence in the cost model, a
recurrence's with its length: an over-estimate at long sequences), and its conv and recurrent state
are not in the activation memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...models.shapes import LanguageSpec, ModelSpec, get, language_shapes, one_encoder
from ..qwen3_vl.shapes import tower


@dataclass(frozen=True)
class HybridLanguage(LanguageSpec):
    """A decoder of Gated DeltaNet and full-attention layers, each with the same MLP (or MoE block).

    The base fields: the full-attention layers' shapes (`heads`, `kv_heads`, `head_dim`), `layers` all the
    layers, `ffn` the MLP width a token passes through (priced as one gated MLP)."""

    linear_layers: int = 0  # Gated DeltaNet layers (the rest are full attention)
    linear_split: int = 0  # one Gated DeltaNet layer's parameters split over tp (in-projections, conv, A_log, dt_bias, out_proj)
    linear_norm: int = 0  # its gated RMSNorm per value head (replicated)
    mlp_split: int = 0  # one layer's MLP parameters split over tp (the dense MLP, or a MoE block's shared expert)
    mlp_replicated: int = 0  # one layer's MLP parameters every tp rank holds (a MoE block's router and shared gate)
    routed_experts: int = 0  # one layer's routed experts' parameters (replicated over tp, sharded over ep)

    def full_layers(self) -> int:
        return self.layers - self.linear_layers

    def full_split(self) -> int:
        """One full-attention layer's q (with its output gate: 2 x heads x head_dim), k, v, o."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return h * 2 * q + 2 * h * kv + q * h

    def decoder_params(self) -> int:
        per_layer = 2 * self.hidden + self.mlp_split + self.mlp_replicated + self.routed_experts
        return (self.layers * per_layer + self.linear_layers * (self.linear_split + self.linear_norm)
                + self.full_layers() * (self.full_split() + self.extra_layer_norms))

    def layer_params(self) -> float:
        return self.decoder_params() / self.layers

    def params(self) -> int:
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.decoder_params() + self.hidden + head

    def replicated_params(self) -> int:
        """The norms (two per layer, the final one, q/k norms, the gated norms), a MoE block's router and
        shared-expert gate."""
        return ((2 * self.layers + 1) * self.hidden + self.full_layers() * self.extra_layer_norms
                + self.linear_layers * self.linear_norm + self.layers * self.mlp_replicated)

    def expert_params(self, ep: int = 1, layers: int | None = None) -> int:
        """The routed experts one rank holds: E / ep of each layer's."""
        return (self.layers if layers is None else layers) * self.routed_experts // ep

    def params_per_rank(self, tp: int, ep: int = 1) -> int:
        """One tp rank's parameters: the split weights / tp, the vocabulary shards, the replicated ones and
        E / ep of the routed experts."""
        if tp == 1 and ep == 1:
            return self.params()
        split = self.params() - self.vocab_params() - self.replicated_params() - self.expert_params()
        return split // tp + self.vocab_params(tp) + self.replicated_params() + self.expert_params(ep)


def deltanet_params(text: Any) -> tuple[int, int]:
    """(split over tp, replicated) parameters of one Gated DeltaNet layer (families/qwen3_5/plans.py)."""
    h, nk, nv = get(text, "hidden_size"), get(text, "linear_num_key_heads"), get(text, "linear_num_value_heads")
    key_dim, value_dim = nk * get(text, "linear_key_head_dim"), nv * get(text, "linear_value_head_dim")
    conv = 2 * key_dim + value_dim
    split = (h * conv + h * value_dim + 2 * h * nv  # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
             + conv * get(text, "linear_conv_kernel_dim") + 2 * nv + value_dim * h)  # conv1d, A_log, dt_bias, out_proj
    return split, get(text, "linear_value_head_dim")


def hybrid_language(text: Any, cfg: Any, ffn: int, mlp_split: int, mlp_replicated: int = 0,
                    routed_experts: int = 0, **moe: int) -> HybridLanguage:
    """`moe`: a MoE block's LanguageSpec fields (experts, top_k, moe_ffn, shared_ffn), for the planner's ep axis."""
    base = language_shapes({**_as_dict(text), "intermediate_size": ffn}, cfg)
    linear_split, linear_norm = deltanet_params(text)
    return HybridLanguage(
        **{**base.__dict__, "qkv_bias": False, "extra_layer_norms": 2 * base.head_dim, **moe},  # q_norm, k_norm
        linear_layers=layer_types(text).count("linear_attention"), linear_split=linear_split,
        linear_norm=linear_norm, mlp_split=mlp_split, mlp_replicated=mlp_replicated, routed_experts=routed_experts)


def layer_types(text: Any) -> list[str]:
    """`layer_types`, or as the config builds it when a config.json leaves it out: every
    `full_attention_interval`-th layer full attention, the others linear."""
    given = get(text, "layer_types")
    if given:
        return list(given)
    every = get(text, "full_attention_interval", 4)
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(get(text, "num_hidden_layers"))]


def _as_dict(cfg: Any) -> dict:
    return dict(cfg) if isinstance(cfg, dict) else cfg.to_dict()


def shapes(cfg: Any) -> ModelSpec:
    text = get(cfg, "text_config")
    h, f = get(text, "hidden_size"), get(text, "intermediate_size")
    return one_encoder("qwen3_5", tower(get(cfg, "vision_config"), 0), hybrid_language(text, cfg, f, 3 * h * f))


SHAPES = {"qwen3_5": shapes}
