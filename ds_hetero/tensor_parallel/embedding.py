"""Vocabulary-parallel input embedding, and the tie of an input embedding to a vocab-parallel head.

    embedding   weight S(0) [V_pad/tp, H]: tp rank r holds the contiguous rows
                [r * V_pad/tp, (r+1) * V_pad/tp) (the head's split: `VocabParallelLMHead`)
                input  token ids R [b, s] (every tp rank the same ids)
                output R [b, s, H]          partial lookups summed: all-reduce (bwd identity)
                       S(seq) [b, s/tp, H]  ... reduce-scattered on the sequence (bwd all-gather),
                                            with sequence parallelism when the caller wants the
                                            decoder's input already on sequence shards

Each rank looks up the ids in its range and writes zero rows for the others; the sum over tp of
those partial rows is the full lookup, exactly (one non-zero term per row). The backward needs
no communication of its own: the output's gradient reaches every rank whole (R) or, under
sequence parallelism, is all-gathered by the reduce-scatter's backward, so each rank's rows get
exactly the gradient they get in one process. The weight is tagged like every tp shard
(`tensor_model_parallel`, `partition_dim` 0, `partition_full_size` = the real vocabulary), so
the gradient norm counts it once per tp rank, checkpoints merge it, and per-shard loading reads
only its rows.

Tied input/output embeddings (`tie_word_embeddings`): the embedding and the vocab-parallel head
hold the *same* parameter object (`tie_to_head`). Both uses feed one leaf, so autograd sums the
two gradients into one `.grad` (once, whatever the layout: tp, cp, sp, dp, ZeRO 0-3), the model's
`named_parameters()` lists it once (the optimizer steps it once, the norm counts it once), and
`state_dict()` lists it under both names (save_pretrained drops the alias, as transformers does).

Padding rows (a vocabulary tp does not divide, `pad_vocab=True`): zero rows at the end of the last
shard; no id reaches them, the head masks their logits to -inf, so their gradient stays zero.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..errors import HeteroConfigError
from .layers import mark_sharded, shard_tensor
from .regions import exit_region
from .vocab import VocabParallelLMHead


def embedding_scale(embedding: nn.Module) -> float | None:
    """The constant factor a scaled word embedding multiplies its lookup by (Gemma's
    `embed_scale`, sqrt(hidden)), or None for a plain one."""
    scale = getattr(embedding, "embed_scale", None)
    if scale is None:
        return None
    # the constant as the module holds it (a float32 buffer), read without touching a meta tensor
    value = getattr(embedding, "scalar_embed_scale", None)
    return float(torch.tensor(value if value is not None else float(scale), dtype=scale.dtype))


def check_plain_embedding(embedding: nn.Module, stage: str) -> None:
    """Only a lookup, times at most a constant (a scaled word embedding), can be split by rows
    (no max_norm or sparse gradient)."""
    plain = type(embedding) is nn.Embedding or (isinstance(embedding, nn.Embedding)
                                                  and embedding_scale(embedding) is not None)
    if not plain or embedding.max_norm is not None or embedding.sparse \
            or embedding.scale_grad_by_freq:
        raise HeteroConfigError(
            f"hetero_parallel.stages.{stage}.tp",
            f"the input embedding is a {type(embedding).__name__} (max_norm={getattr(embedding, 'max_norm', None)}, "
            f"sparse={getattr(embedding, 'sparse', None)}); a vocabulary-parallel embedding needs a plain "
            "torch.nn.Embedding; use language tp 1 for this model")


def padded_vocab(vocab: int, tp: int) -> int:
    return -(-vocab // tp) * tp


class VocabParallelEmbedding(nn.Module):
    """An input embedding split on the vocabulary over `group` (see the module docstring)."""

    def __init__(self, weight: nn.Parameter, group, vocab_size: int, padding_idx: int | None = None,
                 sequence_parallel: bool = False, seq_dim: int = 1, scale: float | None = None):
        super().__init__()
        self.scale = scale  # a scaled word embedding's constant (Gemma's embed_scale), applied as it does
        self.weight = weight
        self.group = group
        self.vocab_size = vocab_size
        self.vocab_start = dist.get_rank(group) * weight.shape[0]
        self.padding_idx = padding_idx  # global id; its row gets no gradient from the lookup (as nn.Embedding)
        self.sequence_parallel = sequence_parallel
        self.seq_dim = seq_dim

    @property
    def num_embeddings(self) -> int:  # what HF code reads from an input embedding
        return self.vocab_size

    @property
    def embedding_dim(self) -> int:
        return self._shape[1]

    @property
    def _shape(self) -> tuple[int, ...]:
        """This rank's shard shape, also while ZeRO 3 holds only a dp partition of it."""
        return tuple(getattr(self.weight, "ds_shape", self.weight.shape))

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, group, pad_vocab: bool = False, sequence_parallel: bool = False,
                       seq_dim: int = 1, stage: str = "language") -> "VocabParallelEmbedding":
        """Shard an untied `nn.Embedding` (every rank holds the same full weight; no communication)."""
        check_plain_embedding(embedding, stage)
        tp, vocab = dist.get_world_size(group), embedding.num_embeddings
        if vocab % tp and not pad_vocab:
            raise HeteroConfigError(
                f"hetero_parallel.stages.{stage}.tp",
                f"tp={tp} does not divide the vocabulary ({vocab}) of the input embedding; pass pad_vocab=True "
                f"to pad it to {padded_vocab(vocab, tp)}, or use a tp that divides {vocab}")
        full = embedding.weight.detach()
        extra = padded_vocab(vocab, tp) - vocab
        if extra:
            full = torch.cat([full, full.new_zeros(extra, full.shape[1])])
        shard = shard_tensor(full, 0, dist.get_rank(group), tp)
        weight = mark_sharded(nn.Parameter(shard, requires_grad=embedding.weight.requires_grad), 0, 1, vocab)
        return cls(weight, group, vocab, embedding.padding_idx, sequence_parallel, seq_dim, embedding_scale(embedding))

    @classmethod
    def tie_to_head(cls, embedding: nn.Embedding, head: VocabParallelLMHead, sequence_parallel: bool = False,
                    seq_dim: int = 1, stage: str = "language") -> "VocabParallelEmbedding":
        """An embedding whose weight *is* `head.weight` (the tied model's one parameter, already sharded)."""
        check_plain_embedding(embedding, stage)
        if embedding.num_embeddings != head.vocab_size or embedding.embedding_dim != head.in_features:
            raise HeteroConfigError(
                f"hetero_parallel.stages.{stage}",
                f"tied input embedding {tuple(embedding.weight.shape)} and output head "
                f"({head.vocab_size}, {head.in_features}) differ in shape")
        return cls(head.weight, head.group, head.vocab_size, embedding.padding_idx, sequence_parallel, seq_dim,
                   embedding_scale(embedding))

    def local_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The ids whose rows this rank's output holds: all of them, or its sequence chunk under
        sequence parallelism (the chunk the reduce-scatter leaves on this rank)."""
        if not self.sequence_parallel:
            return input_ids
        tp = dist.get_world_size(self.group)
        chunk = input_ids.shape[self.seq_dim] // tp
        return input_ids.narrow(self.seq_dim, dist.get_rank(self.group) * chunk, chunk)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        n_local = self.weight.shape[0]
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= n_local)
        pad = self.padding_idx
        local_pad = pad - self.vocab_start if pad is not None and 0 <= pad - self.vocab_start < n_local else None
        # ids of other shards look up row 0 and are zeroed after (in place: the lookup's backward
        # needs only the ids), so their gradient never reaches row 0
        rows = F.embedding(local.masked_fill(outside, 0), self.weight, padding_idx=local_pad)
        rows.masked_fill_(outside.unsqueeze(-1), 0.0)
        if self.scale is not None:  # as the scaled embedding does: the lookup times its constant, in its dtype
            rows = rows * torch.tensor(self.scale, dtype=rows.dtype, device=rows.device)
        return exit_region(rows, self.group, self.sequence_parallel, self.seq_dim)

    def extra_repr(self) -> str:
        return (f"{self.vocab_size}, {self.embedding_dim}, rows [{self.vocab_start}, "
                f"{self.vocab_start + self._shape[0]}), tp={dist.get_world_size(self.group)}, "
                f"sp={self.sequence_parallel}")
