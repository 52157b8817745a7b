"""The shape of the hidden states one pipeline stage sends to the next, from the plan alone.

Every pipeline stage of a language stage holds the same (tp, cp, dp) coordinates, so a rank's
neighbours in its pp group hold the same sequence shard of the same samples: what travels between
them is this rank's local shard of the hidden states, never the whole sequence.

    no sequence shards         [b, S, H]               S: the dp share's padded length
    cp > 1                     [b, S/cp, H]            the cp chunk (context_parallel.sequence)
    sequence parallelism       [b, S/(cp*tp), H]       between decoder layers the hidden states are
                                                       sequence-sharded over tp as well (the tp
                                                       region's exit reduce-scatters onto the chunks)

`batch["input_ids"]` of a sharded batch is the cp chunk (what the vocabulary-parallel embedding
looks up), so the local length is its length divided by tp under sequence parallelism. Both
neighbours compute the shape from the same micro-batch, so no shape is ever sent.
"""

from __future__ import annotations

from ..boundary.inputs import num_shards
from ..layout import StageLayout


def hidden_length(layout: StageLayout, batch_length: int, sharded: bool) -> int:
    """Sequence length of the hidden states a rank holds between decoder layers.

    `batch_length`: the length of the batch's `input_ids` (the cp chunk when `sharded`).
    """
    if not sharded:
        return batch_length
    full = batch_length * layout.cp  # the padded sequence, a multiple of the shard count
    return full // num_shards(layout)


def hidden_shape(layout: StageLayout, batch: dict, sharded: bool, hidden_size: int) -> tuple[int, int, int]:
    """[b, local sequence length, H] of the activation sent between pipeline stages."""
    b, length = batch["input_ids"].shape
    return b, hidden_length(layout, length, sharded), hidden_size
