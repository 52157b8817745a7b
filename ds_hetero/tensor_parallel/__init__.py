"""Per-stage tensor parallelism for Hugging Face modules over an explicit tp group.

See shard.py for the entry points, layers.py for the linears and the parameter tags DeepSpeed
reads, regions.py for where collectives sit, vocab.py for the output head and loss,
embedding.py for the vocab-parallel input embedding and tied embeddings, and
sequence_parallel.py for the sequence-sharded language stage.
"""

from .layers import ColumnParallelLinear, RowParallelLinear, gather_full, shard_tensor
from .shard_plans import PlanTable, ShardPlan, validate_tensor_parallel
from .regions import enter_region, exit_region
from .embedding import VocabParallelEmbedding
from .shard import is_tied, shard_embeddings, shard_language_model, shard_projector, shard_vision_tower
from .vocab import VocabParallelCausalLMLoss, VocabParallelLMHead, vocab_parallel_cross_entropy

__all__ = [
    "ColumnParallelLinear", "PlanTable", "RowParallelLinear", "ShardPlan", "VocabParallelCausalLMLoss",
    "VocabParallelEmbedding", "VocabParallelLMHead", "enter_region", "exit_region", "gather_full", "is_tied",
    "shard_embeddings", "shard_language_model",
    "shard_projector", "shard_tensor", "shard_vision_tower", "validate_tensor_parallel",
    "vocab_parallel_cross_entropy",
]
