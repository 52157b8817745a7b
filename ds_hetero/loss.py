"""The training loss: sum of next-token cross-entropies, normalised by the global label count.

Every layout computes the gradient of the same function a single process would:
    L = sum over the global batch's label tokens of CE / (number of label tokens in the global batch)
Each rank sums the token losses of its own samples; the engine divides by the global count.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # Hugging Face's label for a position that takes no loss


def shifted_labels(labels: torch.Tensor) -> torch.Tensor:
    """Position t predicts token t+1; the last position has no target (Hugging Face's convention)."""
    return F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]


def label_token_count(labels: torch.Tensor) -> int:
    return int((shifted_labels(labels) != IGNORE_INDEX).sum())


def label_token_total(labels: Sequence[torch.Tensor]) -> int:
    """`sum(label_token_count(l) for l in labels)` in three tensor ops and one host read, where
    the per-sample loop takes four ops and a host read per sample (a count: exact either way).
    The shifted labels' last position is the padding value, so a sample's count is that of its
    labels from position 1 on."""
    if not labels:
        return 0
    return int((torch.cat([l[..., 1:].reshape(-1) for l in labels]) != IGNORE_INDEX).sum())


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, head=None, shifted: bool = False) -> torch.Tensor:
    """Sum of per-token losses over label tokens, in fp32.

    `shifted`: the labels are already the targets (shifted on the full sequence before it was
    cut into shards, see context_parallel.sequence).

    With a vocabulary-parallel head the logits are this rank's vocabulary slice and the loss is
    combined over the head's tp group without gathering the full logits.
    """
    from .tensor_parallel import VocabParallelLMHead, vocab_parallel_cross_entropy

    target = labels if shifted else shifted_labels(labels)
    if isinstance(head, VocabParallelLMHead):
        return vocab_parallel_cross_entropy(logits, target, head.group, head.vocab_start, IGNORE_INDEX).sum()
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
