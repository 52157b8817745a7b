"""The router's load-balancing loss as the Hugging Face model adds it, over the right tokens.

Hugging Face (`load_balancing_loss_func`, e.g. modeling_qwen3_vl_moe.py) computes, over every
MoE layer's router logits of one forward and the non-padding tokens of its batch:

    f_e = (top-k assignments to expert e) / (layers x tokens)
    P_e = (sum of softmax probabilities of expert e) / (layers x tokens)
    aux = E * sum_e f_e * P_e,           loss = lm_loss + router_aux_loss_coef * aux

It is not linear in the batch: an aux loss per rank is not the single process's. The rule here
(written in docs/expert-parallel.md and in StepResult):
- one language micro-batch: exactly the single process's aux loss on the global batch. The
  counts (f, and the token count) are all-reduced over the stage's dp x cp group; each rank's
  term E * sum_e f_e * P_e(local sums) / (global layers x tokens) is linear in its own
  probabilities, and the terms add up over dp x cp to the global aux with the global gradient
  (Megatron's "global" aux loss);
- several micro-batches: the same per micro-batch, over all of that micro-batch's tokens (every
  dp x cp rank's share of it), averaged over the micro-batches. The lm loss stays the mean over
  the global batch's label tokens.
tp ranks without sequence parallelism hold the same tokens: each computes the same term (as the
lm loss), and the dp x cp group does not span tp.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist


def local_sums(router_logits: Sequence[torch.Tensor], mask: torch.Tensor | None, top_k: int, num_experts: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(assignments per expert, probability sums per expert (differentiable), rows) of this rank,
    summed over layers, padding excluded, as `load_balancing_loss_func` sums them."""
    device = router_logits[0].device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probs = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    flat = None if mask is None else mask.reshape(-1).to(device=device, dtype=torch.float32)
    for logits in router_logits:
        weights = torch.softmax(logits, dim=-1)
        _, chosen = torch.topk(weights, top_k, dim=-1)
        w = torch.ones(weights.shape[0], dtype=torch.float32, device=device) if flat is None else flat
        counts = counts.scatter_add(0, chosen.reshape(-1), w.repeat_interleave(top_k))
        probs = probs + (weights.float() * w.unsqueeze(-1)).sum(dim=0)
        rows = rows + w.sum()
    return counts.detach(), probs, rows.detach()


def global_aux_term(router_logits: Sequence[torch.Tensor], mask: torch.Tensor | None, top_k: int,
                    num_experts: int, group) -> torch.Tensor:
    """This rank's share of the aux loss of the tokens of `group` (the stage's dp x cp ranks of
    this micro-batch): the shares add up over the group to HF's aux loss on all of them."""
    counts, probs, rows = local_sums(router_logits, mask, top_k, num_experts)
    stats = torch.cat([counts, rows.reshape(1)])
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(stats, group=group)
    total = stats[-1].clamp_min(1.0)
    return num_experts * (stats[:-1] / total * probs).sum() / total


def per_rank_aux(router_logits, mask, top_k: int, num_experts: int) -> torch.Tensor:
    """The wrong rule (a negative control): each rank's aux loss on its own tokens alone, averaged
    over the ranks (what a data-parallel job gets by calling the HF loss on its shard)."""
    counts, probs, rows = local_sums(router_logits, mask, top_k, num_experts)
    total = rows.clamp_min(1.0)
    return num_experts * (counts / total * probs).sum() / total
