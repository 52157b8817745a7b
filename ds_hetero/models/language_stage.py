"""Stage modules shared by every model family: the language stage, and empty boundary rows."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .adapter import placeholder_mask
from .per_sample_attention import segments_mask
from .sample_masks import sample_masks


def empty_rows(stage: nn.Module, dummy_inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """`[0, H]` rows, computed through the whole stage from a dummy input and multiplied by zero.

    A rank whose share of a micro-batch has no image still produces a boundary tensor, and its
    backward must give every parameter a (zero) gradient in the same order as its dp peers do:
    ZeRO-2 reduces gradients from per-parameter hooks into buckets filled in hook order, so a
    rank with a different backward graph would mix up its peers' buckets. Running the same
    modules on a dummy input gives the same graph.

    Called from inside `stage`'s own forward, it runs `stage.forward`, not `stage(...)`: the
    stage's module hooks have already run once for this pass, and must not run again. Under ZeRO 3
    the stage module is the engine's root, whose forward pre-hook (`_start_of_forward_hook` ->
    `reset_step`) checks the recorded module trace with a world-group collective; a second root
    call on the one rank without an image made it call that collective once more than its peers,
    and the step hung. Through `forward` the dummy pass gathers and releases the same submodules'
    parameters, in the same order, as a pass with an image on any other rank.
    """
    rows = stage.forward(**dummy_inputs)
    return rows[:0] + 0 * rows.sum()


class LanguageStage(nn.Module):
    """Embeddings + decoder + head of a Hugging Face VLM; each encoder's rows replace its placeholders.

    `token_ids`: the placeholder id of each encoder stage (or a tuple of ids, when one encoder
    fills several kinds of placeholder: images and video frames), in the order of the adapter's
    encoders (models/adapter.py); `rows` in forward comes in the same order.
    """

    def __init__(self, language_model: nn.Module, lm_head: nn.Module,
                 token_ids: int | Sequence[int | tuple[int, ...]]):
        super().__init__()
        self.language_model = language_model
        self.lm_head = lm_head
        self.token_ids = (token_ids,) if isinstance(token_ids, int) else tuple(token_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        rows: torch.Tensor | Sequence[torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        n_placeholders: Sequence[int] | None = None,
        packed_segments: Sequence[Sequence[int]] | None = None,
    ) -> torch.Tensor:
        """`rows`: one `[T_e, H]` tensor per encoder (a single tensor for a single encoder).
        `n_placeholders`: each encoder's placeholder count, when the caller counted it on the
        host (the engine does); otherwise it is read from `input_ids` (a device sync on a GPU).
        `packed_segments`: packed rows' segment lengths, for the per-sample attention
        (models/per_sample_attention.py), which takes them from the decoder's keywords."""
        embeds, extra = self.embed_inputs(input_ids, rows, n_placeholders)
        # use_cache False: training keeps no cache, and with one the decoder's mask code would not
        # look for packed sequences in `position_ids` (masking_utils, models/packing.py)
        out = self.language_model(
            inputs_embeds=embeds,
            attention_mask=self.decoder_attention_mask(input_ids, embeds, attention_mask, position_ids, packed_segments),
            position_ids=position_ids, use_cache=False, **self.decoder_options(), **extra,
            **self.packed_keywords(input_ids, embeds, attention_mask, packed_segments),
        )
        self.router_logits = self.router_logits_of(out, input_ids, attention_mask)
        return self.final_logits(self.lm_head(out.last_hidden_state))

    # What the decoder needs beyond `inputs_embeds`, `attention_mask` and `position_ids`, and what
    # the loss takes from its outputs beyond the hidden states, come from the hooks below, so that
    # a pipeline chunk (pipeline_parallel/chunk.py) runs exactly what this forward runs: a family
    # overrides the hooks, never `forward`.

    # What the last forward left for the loss besides the logits: a mixture-of-experts family's
    # router logits (expert_parallel.apply.RouterLogits), consumed by the loss; None otherwise.
    router_logits = None

    def decoder_options(self) -> dict:
        """Keyword arguments of every decoder call (a mixture-of-experts family asks for its router
        logits with `output_router_logits`); read at each forward, as the config may change."""
        return {}

    def router_logits_of(self, out, input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
        """What the loss needs of the decoder's output `out` beyond its hidden states (a MoE
        family: the router logits of the layers it ran, with the padding of their tokens), or None."""
        return None

    def embed_inputs(self, input_ids: torch.Tensor, rows, n_placeholders: Sequence[int] | None = None
                     ) -> tuple[torch.Tensor, dict]:
        """(`inputs_embeds`, extra decoder keyword arguments computed from the rows). The extras
        act on the decoder's layers counted from its first one (Qwen3-VL's DeepStack levels are
        added after its first layers), so a pipeline gives them to its first chunk only."""
        return self.embed(input_ids, rows, n_placeholders), {}

    def final_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's output as the model returns it (Gemma 4: its final logit softcap); elementwise,
        so the same on a vocabulary shard and on the last pipeline chunk."""
        return logits

    # A decoder whose layers read more than the hidden states of the layer before (Gemma 4: per-layer
    # inputs computed from the embeddings, keys and values stored by one layer and reused by later
    # ones) says how a pipeline chunk gets them: the chunk adjusts its copy of the decoder
    # (`chunk_decoder`), builds its decoder keywords from the first chunk's embedding extras or from
    # what the chunk before it carried (`chunk_inputs`), and carries on what later layers read
    # (`chunk_carry`, `carried_width` wide), concatenated to its hidden states
    # (pipeline_parallel/chunk.py). The defaults: the extras go to the first chunk only, nothing carried.

    def chunk_decoder(self, decoder: nn.Module, layers: range, first: bool) -> None:
        """Adjust a chunk's shallow copy of the decoder (its `_modules` its own) holding `layers`."""

    def carried_width(self, start: int) -> int:
        """Width of what the chunk before decoder layer `start` carries besides the hidden states."""
        return 0

    def chunk_inputs(self, embeds: torch.Tensor, extra: dict, carried: torch.Tensor | None, layers: range,
                     first: bool) -> tuple[dict, object]:
        """(the decoder keywords of the chunk holding `layers`, what `chunk_carry` needs after the
        decoder ran). `extra`: embed_inputs' extras (first chunk); `carried`: [b, s, carried_width] or None."""
        return (extra if first else {}), None

    def chunk_carry(self, state, layers: range) -> torch.Tensor | None:
        """What the chunk holding `layers` carries to the next ([b, s, carried_width(layers.stop)])."""
        return None

    # Whether `decoder_mask` builds more than causal and sliding-window masks (Gemma: image blocks
    # attended both ways), so that each packed sample gets its own through it (models/sample_masks.py).
    OWN_SAMPLE_MASKS = False

    def packed_keywords(self, input_ids: torch.Tensor, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
                        packed_segments: Sequence[Sequence[int]] | None) -> dict:
        """The decoder keywords of packed rows attended per sample (models/per_sample_attention.py):
        `packed_segments`, and where the family's masks are its own (`OWN_SAMPLE_MASKS`) `packed_masks`,
        each sample's masks built alone; nothing for padded samples or rows the decoder masks itself."""
        if packed_segments is None:
            return {}
        out = {"packed_segments": packed_segments}
        if self.OWN_SAMPLE_MASKS and attention_mask is None:  # a mask given: the decoder masks the row itself
            masks = sample_masks(self.decoder_mask, input_ids, hidden, packed_segments)
            if masks is not None:
                out["packed_masks"] = masks
        return out

    def decoder_attention_mask(self, input_ids: torch.Tensor, hidden: torch.Tensor,
                               attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                               packed_segments: Sequence[Sequence[int]] | None = None):
        """The decoder's `attention_mask` argument: `decoder_mask`'s, or for packed rows attended per
        sample (`packed_segments`) `segments_mask`: no [L, L] mask is built for them."""
        if packed_segments is not None and attention_mask is None:
            return segments_mask(hidden)
        return self.decoder_mask(input_ids, hidden, attention_mask, position_ids)

    def decoder_mask(self, input_ids: torch.Tensor, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
                     position_ids: torch.Tensor | None):
        """The decoder's `attention_mask` argument: the padding mask (the decoder builds its causal
        masks from it), or a family's own masks built from the micro-batch's `input_ids` (every
        pipeline chunk has them; `hidden` gives the shape, dtype and device)."""
        return attention_mask

    def embed(self, input_ids: torch.Tensor, rows, n_placeholders: Sequence[int] | None = None) -> torch.Tensor:
        """The token embeddings with each encoder's rows in place of its placeholders.

        Under sequence parallelism `input_ids` are the tp group's whole (cp) chunk: the
        vocabulary-parallel embedding looks them up and leaves this rank its sequence chunk, whose
        ids (`local_ids`) say where the rows go; `rows` are that chunk's rows.
        """
        rows = (rows,) if isinstance(rows, torch.Tensor) else tuple(rows)
        embeds = self.language_model.get_input_embeddings()(self.embedding_ids(input_ids))
        local_ids = self.local_ids(input_ids)
        for e, (token_id, these) in enumerate(zip(self.token_ids, rows, strict=True)):
            placeholder = placeholder_mask(local_ids, token_id)
            n = int(placeholder.sum()) if n_placeholders is None else n_placeholders[e]
            if n != these.shape[0]:
                raise ValueError(
                    f"input_ids hold {n} image placeholder tokens (id {token_id}) but {these.shape[0]} image rows arrived"
                )
            # Out of place: the rows keep their own autograd path back to their encoder stage.
            embeds = embeds.masked_scatter(placeholder.unsqueeze(-1), these.to(embeds.dtype))
        return embeds

    def local_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The ids of the positions this rank's hidden states hold: `input_ids`, or under sequence
        parallelism this rank's chunk of them (the vocabulary-parallel embedding says which)."""
        embedding = self.language_model.get_input_embeddings()
        return embedding.local_ids(input_ids) if hasattr(embedding, "local_ids") else input_ids

    def embedding_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The ids looked up in the embedding table (a family whose placeholder id lies outside
        the vocabulary maps it to a valid id first; its row is replaced anyway)."""
        return input_ids
