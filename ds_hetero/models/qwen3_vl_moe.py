"""Qwen3-VL-MoE (`Qwen3VLMoeForConditionalGeneration`): Qwen3-VL's stages, DeepStack included,
with a mixture-of-experts decoder whose experts are sharded over `stages.language.ep`.

Everything of the family is in this file (stages, adapter, the tiny model), so it moves as one;
its tp plans are rows of tensor_parallel/family_plans.py and the expert-parallel machinery is
ds_hetero/expert_parallel/.

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

from .qwen3_vl import Qwen3VLAdapter, Qwen3VLLanguageStage, Qwen3VLVisionStage


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

    def forward(self, input_ids, rows, attention_mask=None, position_ids=None, n_placeholders=None):
        from ..expert_parallel.apply import RouterLogits

        embeds, extra = self.embed_inputs(input_ids, rows, n_placeholders)
        with_aux = self.with_aux
        out = self.language_model(
            inputs_embeds=embeds, attention_mask=self.decoder_mask(input_ids, embeds, attention_mask, position_ids),
            position_ids=position_ids, output_router_logits=with_aux, **extra)
        if with_aux:
            t = self.text_config
            self.router_logits = RouterLogits(out.router_logits, self.token_padding(input_ids, attention_mask),
                                              t.num_experts_per_tok, t.num_experts, self.aux_coef)
        return self.lm_head(out.last_hidden_state)


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
        from ..expert_parallel import apply_expert_parallel

        super().shard(groups, cfg)  # attention (and dense MLP layers) over tp
        language = groups["language"]
        if language.is_member and cfg.stages["language"].ep > 1:
            apply_expert_parallel(self.model.get_decoder(), language)
        self._cp_chunk = (language.coord.cp, cfg.stages["language"].cp) if language.is_member else (0, 1)

    @property
    def has_aux_loss(self) -> bool:
        return bool(self.model.config.text_config.output_router_logits)

    def split(self) -> dict[str, nn.Module]:
        language = Qwen3VLMoeLanguageStage(self.model)
        language.cp_chunk = getattr(self, "_cp_chunk", (0, 1))
        return {"vision": Qwen3VLVisionStage(self.model), "language": language}


def tiny_qwen3_vl_moe(seed: int = 0, text_hidden: int = 64, text_layers: int = 3, vision_hidden: int = 32,
                      vision_depth: int = 3, deepstack_visual_indexes=(0, 1), num_experts: int = 8, top_k: int = 2,
                      mlp_only_layers=(), aux_coef: float = 0.05):
    """A Qwen3-VL-MoE with a 300-token vocab: 8 experts, top-2, every decoder layer a MoE block
    (`mlp_only_layers` keeps some dense), the aux loss on with a visible coefficient (0.05);
    expert width a quarter of the hidden size (no square expert matrix): transformers stores fused experts transposed and, loading,
    transposes back only where the shapes differ (a square expert would come back untransposed);
    DeepStack levels from vision blocks 0 and 1 into decoder layers 0 and 1 (of 3)."""
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    from .tiny import QWEN_SPECIAL_IDS

    text = dict(
        vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=text_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=text_hidden // 4, bos_token_id=0, eos_token_id=1,
        pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                         "mrope_interleaved": True},
        num_experts=num_experts, num_experts_per_tok=top_k, moe_intermediate_size=text_hidden // 4,
        decoder_sparse_step=1, mlp_only_layers=list(mlp_only_layers), output_router_logits=True,
        router_aux_loss_coef=aux_coef, tie_word_embeddings=False,
    )
    vision = dict(
        depth=vision_depth, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_heads=4,
        out_hidden_size=text_hidden, patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        num_position_embeddings=16, deepstack_visual_indexes=list(deepstack_visual_indexes),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3VLMoeForConditionalGeneration(Qwen3VLMoeConfig(text_config=text, vision_config=vision,
                                                                   tie_word_embeddings=False, **QWEN_SPECIAL_IDS))
