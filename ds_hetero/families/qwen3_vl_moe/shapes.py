"""The planner's shapes of Qwen3-VL-MoE: Qwen3-VL's (its vision tower, DeepStack mergers, q/k norms in the
decoder) with a mixture of experts in every decoder layer: `num_experts` routed experts of width
`moe_intermediate_size`, `num_experts_per_tok` per token, a replicated router (the planner prices them with
`stages.language.ep`: planner/collectives.py, memory.py).

Every layer must be a MoE layer (`decoder_sparse_step` 1, no `mlp_only_layers`, as in the public 30B-A3B
and 235B-A22B configs): a mix of dense and MoE layers is refused by name rather than priced as one kind.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...models.shapes import ModelSpec, get
from ..qwen3_vl.shapes import shapes as qwen3_vl_shapes


def shapes(cfg: Any) -> ModelSpec:
    text = get(cfg, "text_config")
    if list(get(text, "mlp_only_layers", None) or []) or int(get(text, "decoder_sparse_step", 1) or 1) != 1:
        raise ValueError("qwen3_vl_moe: the planner prices configs whose every decoder layer is a MoE layer "
                         "(decoder_sparse_step 1, mlp_only_layers []); this one mixes dense and MoE layers")
    spec = qwen3_vl_shapes(cfg)
    language = replace(spec.language, experts=int(get(text, "num_experts")), top_k=int(get(text, "num_experts_per_tok")),
                       moe_ffn=int(get(text, "moe_intermediate_size")))
    return ModelSpec("qwen3_vl_moe", spec.encoders, language)


SHAPES = {"qwen3_vl_moe": shapes}
