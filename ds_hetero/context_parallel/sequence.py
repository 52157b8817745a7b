"""The language stage's batch cut into this rank's sequence shard (cp, and tp under sequence parallelism).

The shard convention is the boundary's (`boundary.inputs.shard_bounds`): every sequence of the
padded micro-batch is cut into `n = cp * (tp if sequence_parallel else 1)` contiguous equal chunks.
What a rank computes on is its chunk; what must stay global is computed on the full sequence
first and then sliced, so every shard sees exactly what the single process sees there:

    padding      the micro-batch is right-padded to a multiple of n (pad ids, mask 0, labels -100)
    labels       shifted on the full sequence (position t predicts t+1), THEN sliced: the last
                 token of a chunk predicts the first token of the next chunk
    positions    the full sequence's position ids (Qwen2-VL: M-RoPE from the full sequence), sliced
    mask         the full sequence's causal + padding mask [b, 1, S, S] (attention.py uses it
                 after the all-to-all has gathered the sequence); for packed rows the causal
                 mask inside each sample (`packed_attention_mask`)
    input ids    sliced to the cp chunk: embeddings are computed for the chunk only, and the
                 boundary delivers the image rows of the rank's shard only

With sequence parallelism the decoder's tp region gathers the tp chunks of one cp chunk, so
`position_ids` and the labels are sliced to the cp chunk (what attention and the vocab-parallel
head see), and so are `input_ids`: the vocabulary-parallel embedding looks up the cp chunk's ids
on every tp rank and reduce-scatters the rows onto the tp sub-chunks (`shard_input_ids` gives a
rank's sub-chunk, where its image rows go).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..boundary.inputs import num_shards, shard_bounds
from ..layout import StageLayout
from ..loss import shifted_labels


def is_sharded(layout: StageLayout) -> bool:
    """Whether the stage cuts its sequences (cp > 1, or sequence parallelism with tp > 1)."""
    return num_shards(layout) > 1


def padded_length(length: int, layout: StageLayout) -> int:
    n = num_shards(layout)
    return -(-length // n) * n


def full_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Causal and padding mask of the full sequence, [b, 1, S, S] bool (True = attend).

    The mask Hugging Face builds for sdpa: query i sees key j iff j <= i and j is not padding.
    """
    s = attention_mask.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).tril_()
    return causal[None, None] & attention_mask.bool()[:, None, None, :]


def packed_attention_mask(sequence_ids: torch.Tensor) -> torch.Tensor:
    """Causal mask inside each sample of packed rows, [b, 1, S, S] bool (True = attend).

    `sequence_ids` [b, S]: the sample of every token in its row (models/packing.py). The mask
    transformers builds from packed `position_ids` (`masking_utils.packed_sequence_mask_function`
    and the causal function): query i sees key j iff j <= i and both lie in the same sample. The
    decoder would build it for the shard alone, so under sequence shards it is built here, full.
    """
    s = sequence_ids.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=sequence_ids.device).tril_()
    same = sequence_ids[:, :, None] == sequence_ids[:, None, :]
    return causal[None, None] & same[:, None]


def _cp_bounds(layout: StageLayout, rank: int, length: int) -> tuple[int, int]:
    """[start, stop) of the cp chunk that holds `rank`'s shard."""
    size = length // layout.cp
    c = layout.coord(rank).cp
    return c * size, (c + 1) * size


def shard_input_ids(input_ids: torch.Tensor, layout: StageLayout, rank: int) -> torch.Tensor:
    """`rank`'s chunk of the padded `input_ids` [b, S] (what it embeds)."""
    start, stop = shard_bounds(layout, rank, input_ids.shape[-1])  # raises if S is not a multiple
    return input_ids[..., start:stop]


def shard_language_batch(batch: dict[str, Any], layout: StageLayout, rank: int) -> dict[str, Any]:
    """This rank's shard of a padded language batch (see the module docstring).

    `batch`: `input_ids`, `attention_mask`, `labels` [b, S] with S a multiple of the shard count,
    and `position_ids` ([b, S], [k, b, S] for M-RoPE, or None for 0..S-1). Returns `input_ids`
    (the cp chunk: what the tp group's vocab-parallel embedding takes), `labels` (already
    shifted, the cp chunk), `position_ids` (global values, the cp chunk), `attention_mask` (the
    full sequence's 4-D mask; None for packed rows attended per sample, whose `packed_segments`,
    the whole rows' segment lengths, are passed on: the attention sees whole rows).
    """
    ids = batch["input_ids"]
    length = ids.shape[-1]
    shard_bounds(layout, rank, length)  # raises if the length is not a multiple of the shard count
    c0, c1 = _cp_bounds(layout, rank, length)
    positions = batch.get("position_ids")
    if positions is None:  # what the decoder would count for the full, right-padded sequence
        positions = torch.arange(length, device=ids.device).expand(ids.shape[0], length)
    segments = batch.get("packed_segments")
    if segments is not None:  # attended per sample, over whole rows (models/per_sample_attention.py): no mask
        mask = None
    elif batch.get("attention_mask") is None:
        mask = packed_attention_mask(batch["sequence_ids"])
    else:
        mask = full_attention_mask(batch["attention_mask"])
    return {
        "input_ids": ids[..., c0:c1],
        "labels": shifted_labels(batch["labels"])[..., c0:c1],
        "position_ids": positions[..., c0:c1],
        "attention_mask": mask,
        **({} if segments is None else {"packed_segments": segments}),
    }


def image_positions(samples: Sequence[dict[str, Any]], image_token_id: int | Sequence[int]) -> list[list[int]]:
    """Positions of every sample's placeholders (of any of the ids) in its (right-padded) sequence."""
    ids = torch.tensor([image_token_id] if isinstance(image_token_id, int) else list(image_token_id))
    return [torch.nonzero(torch.isin(s["input_ids"].reshape(-1), ids.to(s["input_ids"].dtype))).flatten().tolist()
            for s in samples]


def padded_lengths(samples: Sequence[dict[str, Any]], dst_dp: Sequence[int], layout: StageLayout) -> list[int]:
    """Per sample: the padded length of the language micro-batch it is in (its dp replica's).

    The language stage pads each dp replica's share of a micro-batch to its longest sample,
    rounded up to the shard count; the boundary must cut the same sequence length.
    """
    longest: dict[int, int] = {}
    for s, d in zip(samples, dst_dp):
        longest[d] = max(longest.get(d, 0), int(s["input_ids"].shape[-1]))
    return [padded_length(longest[d], layout) for d in dst_dp]


__all__ = ["full_attention_mask", "image_positions", "is_sharded", "packed_attention_mask", "padded_length", "padded_lengths",
           "shard_input_ids", "shard_language_batch"]
