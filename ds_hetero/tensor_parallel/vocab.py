"""Vocabulary-parallel output head and cross-entropy: full logits are never gathered.

    head      weight S(0) [V/tp, H]; input R (or S(seq) under sequence parallelism, gathered
              with all-gather / reduce-scatter); output: this rank's logits [.., V/tp]
    loss      per token: log(sum_v exp(z_v)) - z_target, with the max, the sum of exponentials
              and the target logit each combined over tp (two all-reduces of [tokens] floats);
              the loss is R, its gradient R, and each rank's logit gradient is exact for its slice:
              softmax - onehot(target), times the incoming gradient.

Padding: a vocabulary that tp does not divide is a HeteroConfigError unless `pad_vocab=True`;
then the head gets up to tp-1 zero rows, whose logits are -inf (probability 0, gradient 0), so
the loss equals the unpadded one. `gather_full` drops the padding again.

To keep Hugging Face's `model(..., labels=...)` working, `VocabParallelCausalLMLoss` is set as
the model's `loss_function`: it has the signature of transformers' `ForCausalLMLoss` (same
label shift, ignore_index, mean or sum / num_items_in_batch).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..errors import HeteroConfigError
from .layers import ColumnParallelLinear
from .regions import enter_region


class VocabParallelLMHead(ColumnParallelLinear):
    """lm_head split on the vocabulary; enters the tp region itself (it is a region of its own)."""

    vocab_size: int
    vocab_start: int

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, pad_vocab: bool = False, sequence_parallel: bool = False,
                    seq_dim: int = 1, stage: str = "language") -> "VocabParallelLMHead":
        tp, vocab = dist.get_world_size(group), linear.out_features
        if vocab % tp and not pad_vocab:
            raise HeteroConfigError(
                f"hetero_parallel.stages.{stage}.tp",
                f"tp={tp} does not divide the vocabulary ({vocab}) of the output head; pass pad_vocab=True "
                f"to pad it to {-(-vocab // tp) * tp}, or use a tp that divides {vocab}")
        padded = -(-vocab // tp) * tp
        if padded != vocab:
            extra = padded - vocab
            weight = torch.cat([linear.weight.detach(), linear.weight.new_zeros(extra, linear.in_features)])
            bias = None if linear.bias is None else torch.cat([linear.bias.detach(), linear.bias.new_zeros(extra)])
            linear = nn.Linear(linear.in_features, padded, bias=bias is not None, device=weight.device,
                               dtype=weight.dtype)
            with torch.no_grad():
                linear.weight.copy_(weight)
                if bias is not None:
                    linear.bias.copy_(bias)
        head = super().from_linear(linear, group)
        for p in head.parameters():
            p.partition_full_size = vocab
        head.vocab_size, head.vocab_start = vocab, dist.get_rank(group) * (padded // tp)
        head.sequence_parallel, head.seq_dim = sequence_parallel, seq_dim
        return head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = enter_region(x, self.group, self.sequence_parallel, self.seq_dim)
        logits = F.linear(x, self.weight, self.bias)
        n_real = self.vocab_size - self.vocab_start  # columns of this shard that are real tokens
        if n_real < logits.shape[-1]:
            pad = torch.arange(logits.shape[-1], device=logits.device) >= n_real
            logits = logits.masked_fill(pad, float("-inf"))
        return logits


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """fwd: per-token cross-entropy from vocab-sharded logits [N, V/tp]; bwd: local, no communication."""

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start, ignore_index):
        ctx.input_dtype = logits.dtype
        logits = logits.float()  # softmax sums in fp32 whatever the training dtype
        local_max = logits.max(dim=-1).values
        dist.all_reduce(local_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - local_max.unsqueeze(-1)  # a new tensor: the input is never modified
        exp = shifted.exp()

        n_local = logits.shape[-1]
        local_target = target - vocab_start
        mine = (local_target >= 0) & (local_target < n_local)
        picked = shifted.gather(-1, local_target.clamp(0, n_local - 1).unsqueeze(-1)).squeeze(-1)
        # one all-reduce for both sums: [sum of exp, target logit (non-zero on one rank only)]
        sums = torch.stack([exp.sum(dim=-1), torch.where(mine, picked, torch.zeros_like(picked))])
        dist.all_reduce(sums, group=group)
        sum_exp, target_logit = sums[0], sums[1]

        valid = target != ignore_index
        loss = torch.where(valid, sum_exp.log() - target_logit, torch.zeros_like(sum_exp))
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local_target, mine, valid)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_target, mine, valid = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(grad.shape[0], device=grad.device)[mine]
        grad[rows, local_target[mine]] -= 1.0
        grad.mul_((grad_loss * valid).unsqueeze(-1))
        return grad.to(ctx.input_dtype), None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group, vocab_start: int,
                                 ignore_index: int = -100) -> torch.Tensor:
    """Per-token loss (fp32, 0 where target == ignore_index) from logits sharded on the vocabulary.

    `logits` [..., V/tp] are this rank's columns starting at global id `vocab_start`; `target`
    [...] holds global ids. The result is identical on every rank of the group.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    loss = _VocabParallelCrossEntropy.apply(flat, target.reshape(-1), group, vocab_start, ignore_index)
    return loss.view(target.shape)


class VocabParallelCausalLMLoss:
    """transformers' `ForCausalLMLoss` over a `VocabParallelLMHead`'s logits; set as `model.loss_function`."""

    def __init__(self, head: VocabParallelLMHead):
        self.head = head

    def __call__(self, logits, labels, vocab_size=None, num_items_in_batch=None, ignore_index: int = -100,
                 shift_labels=None, **kwargs):
        if shift_labels is None:  # predict token t+1 at position t; the last position has no target
            labels = F.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:]
        shift_labels = shift_labels.to(logits.device)
        losses = vocab_parallel_cross_entropy(logits, shift_labels, self.head.group, self.head.vocab_start,
                                              ignore_index)
        if num_items_in_batch is not None:
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(losses.device)
            return losses.sum() / num_items_in_batch
        return losses.sum() / (shift_labels != ignore_index).sum()
