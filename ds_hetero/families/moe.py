"""What every mixture-of-experts family shares: a language stage that leaves its router logits for the
loss, and the adapter's expert-parallel sharding (Qwen3-VL-MoE, Qwen3.5-MoE).

    language : the family's language stage, whose forward also records every MoE layer's router
               logits; the loss adds `router_aux_loss_coef` x the load-balancing loss over the
               micro-batch's tokens of all dp x cp ranks (expert_parallel/aux_loss.py), as
               `model(**batch).loss` adds it when `text_config.output_router_logits` is set (and
               nothing when it is not)
    shard    : after tp has sharded attention (and any dense MLP), each MoE block's fused experts
               are sliced over the ep group carved out of the dp x cp ranks (expert_parallel/layers.py);
               its router stays replicated, as does a shared expert's gate (the shared expert itself
               is a dense MLP: column / row over tp, by its family's plans)
"""

from __future__ import annotations

from torch import nn


class RouterLogitsStage:
    """Mixed into a family's LanguageStage subclass (before it): LanguageStage's two hooks, which its
    forward and every pipeline chunk call (pipeline_parallel/chunk.py), ask the decoder for
    `output_router_logits` and leave them, with the tokens' padding mask, for `take_aux_loss`.
    The subclass's `__init__` calls `init_router_logits(text_config)`."""

    def init_router_logits(self, text_config) -> None:
        # read at every forward, as the HF model reads it: TRL sets output_router_logits and
        # router_aux_loss_coef on the config after the model was built (its aux_loss_enabled)
        self.text_config = text_config
        self.router_logits = None
        self.cp_chunk = (0, 1)  # (cp rank, cp size): which chunk of a full-sequence mask is this rank's

    @property
    def with_aux(self) -> bool:
        return bool(self.text_config.output_router_logits)

    @property
    def aux_coef(self) -> float:
        return float(self.text_config.router_aux_loss_coef)

    def decoder_options(self) -> dict:
        """Read at every forward: the config may change after the model was built (TRL)."""
        return {"output_router_logits": self.with_aux}

    def router_logits_of(self, out, input_ids, attention_mask):
        """The router logits of the layers the decoder ran (every MoE layer, or a pipeline chunk's), with
        the padding of this rank's tokens and the aux-loss settings; None without the aux loss."""
        from ..expert_parallel.apply import RouterLogits

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


class ExpertParallelAdapter:
    """Mixed into a MoE family's StageAdapter (before it): experts over ep after the tp sharding, the
    aux loss reported. The family's `split` passes its language stage through `router_stage`."""

    def shard(self, groups, cfg) -> None:
        from ..expert_parallel import apply_expert_parallel

        super().shard(groups, cfg)  # attention (and dense MLPs, a shared expert) over tp
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

    def router_stage(self, stage: nn.Module) -> nn.Module:
        stage.cp_chunk = getattr(self, "_cp_chunk", (0, 1))
        return stage
