"""Qwen3.5-MoE (`Qwen3_5MoeForConditionalGeneration`, e.g. Qwen3.5-35B-A3B) split into two stages: Qwen3.5's
(families/qwen3_5/), with a mixture-of-experts block in every decoder layer.

    vision   : Qwen3.5's tower (patch embed + learned positions + blocks + merger, no DeepStack)
    language : embeddings + the decoder (3 Gated DeltaNet layers to 1 gated full-attention layer, sharded
               over tp by heads as Qwen3.5's) + lm_head. Each layer's MoE block
               (`Qwen3_5MoeSparseMoeBlock`): a router (`gate`: softmax, top-k, the weights renormalised),
               fused routed experts (`gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`, the layout
               expert_parallel/layers.py takes) sliced over ep, and a shared expert (a dense gated MLP,
               column / row over tp) scaled by `sigmoid(shared_expert_gate(x))`, added to the routed sum.
               The router and the shared expert's gate are replicated over tp; nothing else of the block
               changes under ep (the HF block calls `experts(x, top_k_index, top_k_weights)`, which the ep
               shard takes as it is).
    loss     : the router logits of every layer, for the aux loss (families/moe.py)

On sequence shards as Qwen3.5 (its Gated DeltaNet heads split over cp: families/qwen3_5/sequence_shards.py).
Refused as for Qwen3.5 (Qwen3_5Adapter.check_layouts): a tp x cp that does not divide the linear-attention
value heads; as for every MoE family (expert_parallel/checks.py): an ep that does not divide the experts,
and what that module refuses of the other axes.
"""

from __future__ import annotations

from torch import nn

from ...models.language_stage import LanguageStage
from ..moe import ExpertParallelAdapter, RouterLogitsStage
from ..qwen2_vl.adapter import vision_token_ids
from ..qwen3_5.adapter import Qwen3_5Adapter, Qwen3_5VisionStage


class Qwen3_5MoeLanguageStage(RouterLogitsStage, LanguageStage):
    """Qwen3.5's language stage that also leaves its router logits for the loss."""

    def __init__(self, model: nn.Module):
        super().__init__(model.model.language_model, model.lm_head, vision_token_ids(model.config))
        self.init_router_logits(model.config.text_config)


def active_ffn(text_config) -> int:
    """The gated-MLP width one token passes through: its top-k experts and the shared expert."""
    t = text_config
    return t.num_experts_per_tok * t.moe_intermediate_size + t.shared_expert_intermediate_size


class Qwen3_5MoeAdapter(ExpertParallelAdapter, Qwen3_5Adapter):
    """Samples as for Qwen2-VL: `pixel_values` [patches, D] and `image_grid_thw` [n, 3], or neither."""

    def language_cost(self, tokens: int) -> int:
        """As the base adapter's, with the width a token's MLP work has (no dense `intermediate_size`)."""
        if getattr(self, "_language_width", None) is None:  # read once, as the base adapter does
            text = self.model.config.text_config
            self._language_width = (text.hidden_size, active_ffn(text))
        return super().language_cost(tokens)

    def split(self) -> dict[str, nn.Module]:
        return {"vision": Qwen3_5VisionStage(self.model), "language": self.router_stage(Qwen3_5MoeLanguageStage(self.model))}
