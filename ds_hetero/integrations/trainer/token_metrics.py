"""Token accuracy and entropy from the engine's own loss pass (TRL's `mean_token_accuracy`, `entropy`).

TRL's SFTTrainer computes them in `compute_loss` from the fused LM head; under ds_hetero the loss
is computed inside the engine's language stage, so `compute_loss` never runs. `TokenMetrics` is
set as `engine.loss_observer`: after each language micro-batch's loss it counts, on the logits
the loss used (no extra forward):

    valid      label tokens (the loss's own targets: shifted labels != -100)
    correct    label tokens whose logit is the largest of the vocabulary (TRL's `is_top1`)
    entropy    sum over label tokens of the next-token distribution's entropy

With a vocabulary-parallel head each tp rank holds a slice of the vocabulary: the maximum, the
log-normaliser and the expectation are combined over the head's tp group (three small
all-reduces of [tokens] vectors, which every tp rank of the language stage runs in lock-step),
without gathering the logits. Sums stay on the device; `reduce()` (at log time, collective over
the boundary group) adds every language dp replica's and cp shard's counts, one rank per
replica-shard (tp rank 0) contributing, as the engine's loss sum does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...loss import IGNORE_INDEX, shifted_labels


def _token_stats(logits: torch.Tensor, target: torch.Tensor, head) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(valid, correct, entropy sum) of one micro-batch, float64 scalars on the logits' device."""
    from ...tensor_parallel import VocabParallelLMHead

    mask = target != IGNORE_INDEX
    x = logits.float()[mask]  # [n, V or V/tp]
    t = target[mask]
    n = x.new_tensor(float(mask.sum()), dtype=torch.float64)
    if isinstance(head, VocabParallelLMHead):
        group, start = head.group, head.vocab_start
        top = x.max(-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        local = (t >= start) & (t < start + x.shape[-1])
        own = x.gather(-1, (t - start).clamp(0, x.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        hit = (local & (own >= top)).float()
        e = (x - top.unsqueeze(-1)).exp()
        z, ez = e.sum(-1), (e * x).sum(-1)
        for v in (hit, z, ez):
            dist.all_reduce(v, group=group)
        correct = hit.double().sum()
        # H = log Z - E[x], with x shifted by its max: log sum exp(x - m) + m - sum p x
        entropy = (z.log() + top - ez / z).double().sum()
        return n, correct, entropy
    top = x.max(-1).values
    correct = (x.gather(-1, t.unsqueeze(-1)).squeeze(-1) >= top).double().sum()
    logp = torch.log_softmax(x, -1)
    entropy = -(logp.exp() * logp).sum(-1).double().sum()
    return n, correct, entropy


class TokenMetrics:
    """The engine's `loss_observer`: per-window sums of label tokens, top-1 hits and entropy."""

    def __init__(self, engine):
        self.engine = engine
        from ...tensor_parallel import VocabParallelLMHead

        language = engine.stages.language
        head = language.module.lm_head
        self.head = head if isinstance(head, VocabParallelLMHead) else None  # its tp group combines the stats
        # tp ranks hold identical counts after the all-reduces: one of them contributes
        self.contributes = language.held and language.coord.tp == 0
        self.sums = None
        self.steps = 0
        engine.loss_observer = self

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, shifted: bool) -> None:
        target = labels if shifted else shifted_labels(labels)
        with torch.no_grad():
            stats = torch.stack(_token_stats(logits, target.to(logits.device), self.head))
        self.sums = stats if self.sums is None else self.sums + stats

    def reduce(self) -> dict[str, float]:
        """{"mean_token_accuracy", "entropy"} over every label token since the last call, the same on every
        rank (TRL's definitions: hits / label tokens, entropy sum / label tokens). Collective over the
        engine's boundary group."""
        device = self.engine.device
        vec = torch.zeros(3, dtype=torch.float64, device=device)
        if self.contributes and self.sums is not None:
            vec += self.sums.to(device)
        self.sums = None
        dist.all_reduce(vec, group=self.engine.groups.boundary)
        n, correct, entropy = vec.tolist()
        if n == 0:
            return {}
        return {"mean_token_accuracy": correct / n, "entropy": entropy / n}
