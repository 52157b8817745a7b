"""One pipeline stage (chunk) of a language stage: a contiguous run of decoder layers.

    first chunk   : embeddings (each encoder's rows replace its placeholders) + its layers -> hidden
    middle chunk  : hidden -> its layers -> hidden
    last chunk    : hidden -> its layers -> final norm -> head -> logits
    (pp 1 is LanguageStage itself, models/language_stage.py)

How: the chunk runs the Hugging Face decoder's own `forward` (causal mask, rotary or mRoPE
position embeddings, per-layer attention types) on a shallow copy of the decoder whose `layers`
is only this chunk's slice, whose `norm` is the identity except on the last chunk, and whose
embeddings are absent except on the first. Every chunk computes the mask and the position
embeddings itself from the micro-batch's `attention_mask` and `position_ids`, which every rank
of the pipeline has (they are cheap); only the hidden states travel between chunks, and, where a
family's layers read more than the layer before them gives (Gemma 4's per-layer inputs and shared
keys and values), what its later layers read, concatenated to them (`input_width` wide). So the
chunk's arithmetic is the model's own, layer for layer, and no model family needs its own cut.

Why not DeepSpeed's PipelineModule: it requires the model as a list of LayerSpecs and its
PipelineEngine owns the whole model, its data loading and its step; a Hugging Face decoder cut
into per-chunk engines that sit next to the encoders' engines (with one gradient norm over all
of them) fits neither. The schedule still uses DeepSpeed's 1F1B instruction stream
(schedule/pipeline.py).

The chunk holds only its own parameters (the rest of the decoder is moved to the meta device by
`cut_language_stage`), so its DeepSpeed engine reduces and updates exactly them.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn


class PipelineChunk(nn.Module):
    """Pipeline stage `index` of `pp` of a language stage (models/language_stage.py), holding decoder layers `layers`.

    The stage is read, not imported: its decoder (`language_model`), `token_ids`, `embed_inputs`,
    `decoder_attention_mask`, `lm_head`, `final_logits` and the carry hooks (`chunk_decoder`,
    `chunk_inputs`, `chunk_carry`, `carried_width`), so this axis sits below the model adapters."""

    def __init__(self, stage: nn.Module, index: int, pp: int, layers: range):
        super().__init__()
        self.index, self.pp, self.layers = index, pp, layers
        self.is_first, self.is_last = index == 0, index == pp - 1
        self.token_ids = stage.token_ids
        decoder = stage.language_model
        chunk = copy.copy(decoder)  # shares every submodule and parameter with the model ...
        chunk._modules = dict(decoder._modules)  # ... but owns its table of submodules
        chunk._parameters = dict(decoder._parameters)
        chunk._buffers = dict(decoder._buffers)
        chunk._modules["layers"] = nn.ModuleList([decoder.layers[i] for i in layers])
        if not self.is_last:
            chunk._modules["norm"] = nn.Identity()
        if not self.is_first:
            chunk._modules["embed_tokens"] = None  # the decoder embeds nothing: it gets inputs_embeds
        chunk.config = chunk_config(decoder.config, layers)
        # what a family's decoder reads besides the hidden states (Gemma 4: per-layer inputs, shared
        # keys and values): the chunk's decoder adjusted, its inputs and what it carries on
        # (LanguageStage.chunk_decoder / chunk_inputs / chunk_carry), `carried` wide past the hidden states
        stage.chunk_decoder(chunk, layers, self.is_first)
        self._chunk_inputs, self._chunk_carry = stage.chunk_inputs, stage.chunk_carry
        self.hidden_size = decoder.config.hidden_size
        self.input_width = self.hidden_size + (0 if self.is_first else stage.carried_width(layers.start))
        self.decoder = chunk
        self.embed = decoder.get_input_embeddings() if self.is_first else None
        # The language stage's own embedding step (LanguageStage.embed_inputs: a family's id mapping,
        # the decoder extras computed from the rows (DeepStack levels) and
        # under sequence parallelism the vocabulary-parallel lookup that leaves this rank its tp
        # chunk, whose ids say where the rows go). A bound method, not a submodule: the chunk
        # must not hold the other chunks' parameters.
        self._embed_inputs = stage.embed_inputs if self.is_first else None
        # The family's decoder mask (Gemma 3: image blocks bidirectional), built by every chunk from
        # the micro-batch's `input_ids`, as the pp-1 stage builds it (LanguageStage.decoder_attention_mask).
        self._decoder_mask = stage.decoder_attention_mask
        # ... and the packed rows' keywords: their segments and a family's own per-sample masks
        # (LanguageStage.packed_keywords), which every chunk builds the same way
        self._packed_keywords = stage.packed_keywords
        # The family's decoder options and what its loss takes from the decoder's output (a MoE
        # family's router logits, of this chunk's layers only: expert_parallel/aux_loss.py sums
        # them over the chunks), as the pp-1 stage calls them (LanguageStage.router_logits_of).
        self._decoder_options, self._router_logits_of = stage.decoder_options, stage.router_logits_of
        self.router_logits = None
        self.lm_head = stage.lm_head if self.is_last else None
        self._final_logits = stage.final_logits

    def forward(
        self,
        hidden_or_ids: torch.Tensor,
        rows: Sequence[torch.Tensor] = (),
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        n_placeholders: Sequence[int] | None = None,
        input_ids: torch.Tensor | None = None,
        packed_segments=None,
    ) -> torch.Tensor:
        """First chunk: `input_ids` [b, s] and each encoder's rows; others: hidden [b, s, H] and the
        micro-batch's `input_ids` (a family's mask is built from them).
        Returns hidden [b, s, H], or logits on the last chunk. With sequence shards s is this
        rank's shard (the ids: the cp chunk; hidden: its tp sub-chunk under sequence parallelism).
        `packed_segments`: as LanguageStage.forward's, handed to the decoder."""
        extra, carried = {}, None
        if self.is_first:
            input_ids = hidden_or_ids
            embeds, extra = self._embed_inputs(input_ids, rows, n_placeholders)
        elif self.input_width > self.hidden_size:  # [hidden | what the chunk before carried]
            embeds, carried = hidden_or_ids.split([self.hidden_size, self.input_width - self.hidden_size], dim=-1)
        else:
            embeds = hidden_or_ids
        extra, state = self._chunk_inputs(embeds, extra, carried, self.layers, self.is_first)
        mask = self._decoder_mask(input_ids, embeds, attention_mask, position_ids, packed_segments)
        # use_cache False: a cache built from the chunk's config has only the chunk's layers, but
        # the layers index it by their index in the whole decoder
        out = self.decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
                           use_cache=False, **self._decoder_options(), **extra,
                           **self._packed_keywords(input_ids, embeds, attention_mask, packed_segments))
        self.router_logits = self._router_logits_of(out, input_ids, attention_mask)
        hidden = out.last_hidden_state
        if self.is_last:
            return self._final_logits(self.lm_head(hidden))
        carry = self._chunk_carry(state, self.layers)
        return hidden if carry is None else torch.cat([hidden, carry.to(hidden.dtype)], dim=-1)


def chunk_config(config, layers: range):
    """The decoder's config as seen by a chunk holding `layers`: decoders index per-layer settings
    by their position in `self.layers` (`config.layer_types[i]` picks layer i's mask and rotary
    table: Gemma 3's sliding and full layers, Qwen2's sliding-window layers), which in a chunk is
    the position inside the chunk, so the chunk's config lists its own layers' settings only.
    A shallow copy: every other setting is the model's, `num_hidden_layers` included (decoders
    only slice `self.layers[:num_hidden_layers]` with it, and checkpoint/layer_map.py reads the
    model's layer count from it)."""
    types = getattr(config, "layer_types", None)
    if types is None:
        return config
    config = copy.copy(config)
    config.layer_types = [types[i] for i in layers]
    return config


def cut_language_stage(stage: nn.Module, index: int, pp: int, cut: Sequence[range]) -> PipelineChunk:
    """This rank's chunk; every parameter of the language stage outside it goes to the meta
    device (its memory is freed, and no engine or checkpoint mistakes it for a held one)."""
    chunk = PipelineChunk(stage, index, pp, cut[index])
    mine = {id(p) for p in chunk.parameters()}
    for module in stage.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if id(p) not in mine and not p.is_meta:
                setattr(module, name, nn.Parameter(p.detach().to("meta"), requires_grad=p.requires_grad))
    return chunk
