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

Pipelined (pp > 1): aux is a product of sums over ALL layers, not a sum of per-layer terms, so
no pipeline stage can form its share from its own layers. The sums are carried instead: each
pipeline stage adds its layers' partial sums (counts and rows detached, probability sums with
their gradient) to the ones it received and sends the total on with its hidden states (one
vector of `stats_size(E)` floats, `add_stage_stats`); the last stage forms the value from every
layer's sums (`aux_of_stats`, the same all-reduce of the counts over the stage's dp x cp group
as with pp 1); in the backward the vector's gradient travels back with the hidden states'
(d aux / d P_e = E * C_e / R^2, the total counts folded in), so each stage's backward gets the
gradient of its own layers' probabilities. The one collective stays inside the last pipeline
stage, entered by its dp x cp ranks at the same 1F1B instruction.
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


def reduce_counts(stats: torch.Tensor, groups) -> torch.Tensor:
    """`stats` summed over every group in `groups` (None or a group of one: nothing)."""
    for group in groups:
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(stats, group=group)
    return stats


def global_aux_term(router_logits: Sequence[torch.Tensor], mask: torch.Tensor | None, top_k: int,
                    num_experts: int, groups=()) -> torch.Tensor:
    """This rank's share of the aux loss of the tokens of `groups` (the stage's dp x cp ranks of
    this micro-batch, and its tp ranks under sequence parallelism): the shares add up over them
    to HF's aux loss on all of them."""
    counts, probs, rows = local_sums(router_logits, mask, top_k, num_experts)
    return aux_of_stats(torch.cat([counts, probs, rows.reshape(1), rows.new_zeros(1)]), num_experts, groups)


# ----------------------------------------------------------------------------- carried over pipeline stages
def stats_size(num_experts: int) -> int:
    """[counts (E) | probability sums (E) | rows | aux of earlier stages (0; a negative control's)]."""
    return 2 * num_experts + 2


def stage_stats(router_logits, mask, top_k: int, num_experts: int, device, dtype=torch.float32) -> torch.Tensor:
    """This pipeline stage's partial sums (`stats_size`), zeros for a chunk without MoE layers."""
    if not router_logits:
        return torch.zeros(stats_size(num_experts), dtype=dtype, device=device)
    counts, probs, rows = local_sums(router_logits, mask, top_k, num_experts)
    return torch.cat([counts, probs, rows.reshape(1), rows.new_zeros(1)])


def add_stage_stats(incoming: torch.Tensor | None, local: torch.Tensor, num_experts: int, rule: str = "global",
                    groups=(), stages: int = 1) -> torch.Tensor:
    """What this pipeline stage sends on: the received sums plus its own layers'.

    `rule="per_stage"` is the wrong rule (a negative control only): this stage's aux loss over
    its own layers, averaged over the `stages`, added to the last slot, and no sums passed on."""
    if rule == "per_stage":
        own = aux_of_stats(local, num_experts, groups) / stages
        local = torch.cat([torch.zeros_like(local[:-1]), own.reshape(1)])
    return local if incoming is None else incoming + local


def aux_of_stats(stats: torch.Tensor, num_experts: int, groups=()) -> torch.Tensor:
    """This rank's share of the aux loss from the sums over every layer of its tokens: the counts
    and rows summed over `groups` (detached), the term linear in its own probability sums."""
    e = num_experts
    counts = reduce_counts(torch.cat([stats[:e], stats[2 * e:2 * e + 1]]).detach().clone(), groups)
    total = counts[-1].clamp_min(1.0)
    return e * (counts[:-1] / total * stats[e:2 * e]).sum() / total + stats[-1]


def per_rank_aux(router_logits, mask, top_k: int, num_experts: int) -> torch.Tensor:
    """The wrong rule (a negative control): each rank's aux loss on its own tokens alone, averaged
    over the ranks (what a data-parallel job gets by calling the HF loss on its shard)."""
    counts, probs, rows = local_sums(router_logits, mask, top_k, num_experts)
    total = rows.clamp_min(1.0)
    return num_experts * (counts / total * probs).sum() / total
