"""Qwen3-VL-MoE (`Qwen3VLMoeForConditionalGeneration`): Qwen3-VL's stages, DeepStack included,
with a mixture-of-experts decoder whose experts are sharded over `stages.language.ep`
(the expert-parallel machinery is ds_hetero/expert_parallel/).

    vision   : as Qwen3-VL (models/qwen3_vl.py): merged rows and the DeepStack levels side by side
    language : embeddings + the MoE decoder + lm_head. Attention is sharded by heads over the
               stage's tp; each MoE block keeps its router (replicated) and its experts are
               sliced over the ep group carved out of the dp x cp ranks (expert_parallel/layers.py);
               a layer in `mlp_only_layers` keeps its dense MLP (column/row over tp)
    loss     : the forward records every MoE layer's router logits; the loss adds
               `router_aux_loss_coef` x the load-balancing loss over the micro-batch's tokens of
               all dp x cp ranks (expert_parallel/aux_loss.py), as `model(**batch).loss` adds it
               when `text_config.output_router_logits` is set (and nothing when it is not)
"""

from __future__ import annotations

import torch
from torch import nn

from ..qwen3_vl.adapter import Qwen3VLAdapter, Qwen3VLLanguageStage, Qwen3VLVisionStage


class Qwen3VLMoeLanguageStage(Qwen3VLLanguageStage):
    """Qwen3-VL's language stage that also leaves its router logits for the loss."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        # read at every forward, as the HF model reads it: TRL sets output_router_logits and
        # router_aux_loss_coef on the config after the model was built (its aux_loss_enabled)
        self.text_config = model.config.text_config
        self.router_logits = None
        self.cp_chunk = (0, 1)  # (cp rank, cp size): which chunk of a full-sequence mask is this rank's

    @property
    def with_aux(self) -> bool:
        return bool(self.text_config.output_router_logits)

    @property
    def aux_coef(self) -> float:
        return float(self.text_config.router_aux_loss_coef)

    def decoder_options(self) -> dict:
        return {"output_router_logits": self.with_aux}

    def router_logits_of(self, out, input_ids, attention_mask):
        """The router logits of the layers the decoder ran (every MoE layer, or a pipeline chunk's),
        with the padding of this rank's tokens and the aux-loss settings; None without the aux loss."""
        from ...expert_parallel.apply import RouterLogits

        if not self.with_aux:
            return None
        t = self.text_config
        return RouterLogits(out.router_logits, self.token_padding(input_ids, attention_mask),
                            t.num_experts_per_tok, t.num_experts, self.aux_coef)

    def token_padding(self, input_ids, attention_mask):
        """1 where this rank's tokens (the rows its router saw) are not padding, as the HF aux loss
        weights them. On sequence shards the mask is the full sequence's [b, 1, S, S] causal and
        padding mask (context_parallel.sequence): its last query row is the key padding; this rank's
        tokens are its cp chunk of it, and under sequence parallelism its tp chunk of that."""
        if attention_mask is None or attention_mask.dim() == 2:
            return attention_mask
        keys = attention_mask[:, 0, -1, :]
        c, cp = self.cp_chunk
        size = keys.shape[-1] // cp
        return self.local_ids(keys[..., c * size:(c + 1) * size].long())


class Qwen3VLMoeAdapter(Qwen3VLAdapter):
    """Samples as for Qwen2-VL / Qwen3-VL."""

    def shard(self, groups, cfg) -> None:
        from ...expert_parallel import apply_expert_parallel

        super().shard(groups, cfg)  # attention (and dense MLP layers) over tp
        language = groups["language"]
        if language.is_member and cfg.stages["language"].ep > 1:
            apply_expert_parallel(self.model.get_decoder(), language)
        self._cp_chunk = (language.coord.cp, cfg.stages["language"].cp) if language.is_member else (0, 1)

    @property
    def has_aux_loss(self) -> bool:
        return bool(self.model.config.text_config.output_router_logits)

    @property
    def router_experts(self) -> int:
        t = self.model.config.text_config
        return int(t.num_experts) if t.output_router_logits else 0

    @property
    def router_aux_coef(self) -> float:
        return float(self.model.config.text_config.router_aux_loss_coef)

    def split(self) -> dict[str, nn.Module]:
        language = Qwen3VLMoeLanguageStage(self.model)
        language.cp_chunk = getattr(self, "_cp_chunk", (0, 1))
        return {"vision": Qwen3VLVisionStage(self.model), "language": language}
