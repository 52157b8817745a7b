"""The planner's shapes of Qwen3.5 (dense), read from its Hugging Face config: Qwen3-VL's tower without
DeepStack, and a decoder of two layer types (`layer_types`): Gated DeltaNet (linear attention) and gated
full attention, 3 to 1.

The planner's records (models/shapes.py) describe a decoder of identical attention layers. `HybridLanguage`
keeps their fields for the full-attention layers' shapes (what flops.py, collectives.py and activations.py
read) and counts the parameters exactly, layer type by layer type: `params`, `replicated_params` and
`params_per_rank` equal the model's; `layer_params` (what a pipeline chunk is priced by) is their mean
per layer. Its GEMMs are counted layer type by layer type (`mixer_gemms`, what planner/flops.py prices and the
runtime's FLOPs count): a full-attention layer's gated query (q and its gate: 2 x heads x head_dim),
k, v, o and its attention; a Gated DeltaNet layer's in-projections, depthwise convolution, out
projection and the chunked gated delta rule (chunks of 64: per chunk the two intra-chunk products,
the state's read twice, the intra-chunk output and the state update), linear in the sequence.
Still approximate: its element-wise work and activation memory are a full-attention layer's, and
its conv and recurrent state are not in the activation memory.
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
    linear_key_heads: int = 0  # a Gated DeltaNet layer's q/k heads, their width, its value heads, theirs
    linear_key_dim: int = 0
    linear_value_heads: int = 0
    linear_value_dim: int = 0
    conv_kernel: int = 0  # its depthwise causal convolution's kernel

    def mixer_gemms(self, samples: int, seq: int, tokens: int, tp: int, attn: int, linear: int,
                    layers: int) -> list[tuple[int, int, int, int, int]]:
        """(m, k, n, count, backward GEMMs) of the token mixers of `layers` decoder layers on one tp rank:
        `samples` sequences of `seq` tokens (`tokens` through the linears), `attn` score columns per
        query row in the full-attention layers, `linear` backward GEMMs per weight GEMM. The layer
        types in the model's proportion (a pipeline chunk's share rounded)."""
        h, hd = self.hidden, self.head_dim
        full = round(layers * self.full_layers() / self.layers)
        lin = layers - full
        q, kv, heads = self.heads * hd // tp, self.kv_heads * hd // tp, self.heads // tp
        out = [(tokens, h, 2 * q + 2 * kv, full, linear),  # q and its gate, k, v (column)
               (tokens, q, h, full, linear),  # o (row)
               (seq, hd, attn, samples * heads * full, 2), (seq, attn, hd, samples * heads * full, 2)]
        dk, dv = self.linear_key_dim, self.linear_value_dim
        key, value, vh = self.linear_key_heads * dk // tp, self.linear_value_heads * dv // tp, self.linear_value_heads // tp
        conv = 2 * key + value
        heads = samples * vh * lin  # every value head of every sequence (q and k repeated to them)
        c, n = DELTA_CHUNK, -(-seq // DELTA_CHUNK)
        out += [(tokens, h, conv + value + 2 * vh, lin, linear),  # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
                (tokens, self.conv_kernel, conv, lin, 2),  # the depthwise convolution (2 L C K FLOPs)
                (tokens, value, h, lin, linear),  # out_proj (row)
                # the chunked delta rule, per value head and chunk, as autograd runs it:
                (c, dk, c, 2 * n * heads, 2),  # k_beta k^T and q k^T within the chunk
                (c, c, dk + dv, n * heads, 1, 0),  # the two triangular solves' matrix gradients (backward only)
                (c, dk, dv, 2 * (n - 1) * heads, 2),  # the state read by the decayed keys and by the queries ...
                (c, dk, dv, 2 * heads, 1),  # ... the first chunk's state is zero: no gradient to it
                (c, c, dv, n * heads, 2),  # the intra-chunk output
                (dk, c, dv, (n - 1) * heads, 2),  # the state update k^T v_new ...
                (dk, c, dv, heads, 0)]  # ... the last chunk's is not read again: no backward
        return [g for g in out if g[3]]

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


DELTA_CHUNK = 64  # the chunk of the chunked gated delta rule (HF's torch path; fla's kernels chunk by 64 too)


def hybrid_language(text: Any, cfg: Any, ffn: int, mlp_split: int, mlp_replicated: int = 0,
                    routed_experts: int = 0, **moe: int) -> HybridLanguage:
    """`moe`: a MoE block's LanguageSpec fields (experts, top_k, moe_ffn, shared_ffn), for the planner's ep axis."""
    base = language_shapes({**_as_dict(text), "intermediate_size": ffn}, cfg)
    linear_split, linear_norm = deltanet_params(text)
    return HybridLanguage(
        **{**base.__dict__, "qkv_bias": False, "extra_layer_norms": 2 * base.head_dim, **moe},  # q_norm, k_norm
        linear_layers=layer_types(text).count("linear_attention"), linear_split=linear_split,
        linear_norm=linear_norm, mlp_split=mlp_split, mlp_replicated=mlp_replicated, routed_experts=routed_experts,
        linear_key_heads=get(text, "linear_num_key_heads"), linear_key_dim=get(text, "linear_key_head_dim"),
        linear_value_heads=get(text, "linear_num_value_heads"), linear_value_dim=get(text, "linear_value_head_dim"),
        conv_kernel=get(text, "linear_conv_kernel_dim"))


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
