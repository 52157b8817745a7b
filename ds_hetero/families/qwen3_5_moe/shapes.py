"""The planner's shapes of Qwen3.5-MoE, read from its Hugging Face config: Qwen3.5's
(families/qwen3_5/shapes.py: the tower, the Gated DeltaNet and full-attention layers counted exactly) with
a MoE block in every layer: `num_experts` routed experts of width `moe_intermediate_size`,
`num_experts_per_tok` of them per token, a shared expert of width `shared_expert_intermediate_size`
behind a one-output sigmoid gate, and a router.

Parameters: the routed experts replicated over tp and sharded over ep (`expert_params(ep)`), the router
and the shared gate replicated, the shared expert split over tp (as the engine shards them). Work: a
token's routed experts and its shared expert (`ffn`, a dense SwiGLU split over tp) are priced apart; the MoE fields (`experts`, `top_k`, `moe_ffn`, `shared_ffn`) put the block on the
planner's ep axis, which prices the routed experts, the shared expert and the dispatch all-to-all.
"""

from __future__ import annotations

from typing import Any

from ...models.shapes import ModelSpec, get, one_encoder
from ..qwen3_5.shapes import hybrid_language
from ..qwen3_vl.shapes import tower


def moe_widths(text: Any) -> dict[str, int]:
    """The MoE block's sizes: routed experts, experts per token, an expert's width, the shared expert's."""
    return {"experts": int(get(text, "num_experts")), "top_k": int(get(text, "num_experts_per_tok")),
            "moe_ffn": int(get(text, "moe_intermediate_size")),
            "shared_ffn": int(get(text, "shared_expert_intermediate_size"))}


def shapes(cfg: Any) -> ModelSpec:
    text = get(cfg, "text_config")
    h, w = get(text, "hidden_size"), moe_widths(text)
    language = hybrid_language(
        text, cfg, ffn=w["shared_ffn"], mlp_split=3 * h * w["shared_ffn"],
        mlp_replicated=w["experts"] * h + h,  # the router [E, h] and the shared expert's gate [1, h]
        routed_experts=w["experts"] * 3 * h * w["moe_ffn"],  # gate_up [E, 2f, h], down [E, h, f]
        experts=w["experts"], top_k=w["top_k"], moe_ffn=w["moe_ffn"], shared_ffn=w["shared_ffn"])
    return one_encoder("qwen3_5_moe", tower(get(cfg, "vision_config"), 0), language)


SHAPES = {"qwen3_5_moe": shapes}
