"""Qwen3-VL-MoE (`Qwen3VLMoeForConditionalGeneration`): Qwen3-VL's stages, DeepStack included,
with a mixture-of-experts decoder whose experts are sharded over `stages.language.ep`
(the expert-parallel machinery is ds_hetero/expert_parallel/; what MoE families share, families/moe.py).

    vision   : as Qwen3-VL (families/qwen3_vl/): merged rows and the DeepStack levels side by side
    language : embeddings + the MoE decoder + lm_head. Attention is sharded by heads over the
               stage's tp; each MoE block keeps its router (replicated) and its experts are
               sliced over the ep group (families/moe.py); a layer in `mlp_only_layers` keeps its
               dense MLP (column/row over tp)
    loss     : the router logits of every MoE layer, for the aux loss (families/moe.py)
"""

from __future__ import annotations

from torch import nn

from ..moe import ExpertParallelAdapter, RouterLogitsStage
from ..qwen3_vl.adapter import Qwen3VLAdapter, Qwen3VLLanguageStage, Qwen3VLVisionStage


class Qwen3VLMoeLanguageStage(RouterLogitsStage, Qwen3VLLanguageStage):
    """Qwen3-VL's language stage that also leaves its router logits for the loss."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.init_router_logits(model.config.text_config)


class Qwen3VLMoeAdapter(ExpertParallelAdapter, Qwen3VLAdapter):
    """Samples as for Qwen2-VL / Qwen3-VL."""

    def split(self) -> dict[str, nn.Module]:
        return {"vision": Qwen3VLVisionStage(self.model), "language": self.router_stage(Qwen3VLMoeLanguageStage(self.model))}
