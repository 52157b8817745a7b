"""The language stage on sequence shards: context parallelism (Ulysses over cp) and sequence parallelism.

sequence.py    the padded batch -> this rank's shard (global positions, full mask, shifted labels)
attention.py   attention over sequence shards (DeepSpeed's DistributedAttention over the stage's cp group)
"""

from .attention import ATTENTION_NAME, SequenceShardedAttention, apply_sequence_sharded_attention, check_context_parallel
from .sequence import (full_attention_mask, image_positions, is_sharded, padded_length, padded_lengths,
                       shard_input_ids, shard_language_batch)

__all__ = [
    "ATTENTION_NAME", "SequenceShardedAttention", "apply_sequence_sharded_attention", "check_context_parallel",
    "full_attention_mask", "image_positions", "is_sharded", "padded_length", "padded_lengths",
    "shard_input_ids", "shard_language_batch",
]
