"""Token dispatch and combine over an expert-parallel group: one all-to-all each way, dropless.

    dispatch  the (token, expert) assignments of this rank, sorted by expert, go to the rank that
              holds the expert (expert e lives on ep rank e // experts_per_rank); every rank
              receives, from each source in ep-rank order, that source's rows for its own
              experts, grouped by local expert
    combine   the expert outputs travel back the same way (the reversed all-to-all) and are
              put back in assignment order

Both are `_AllToAllV` from DeepSpeed's AutoEP (module_inject/auto_ep_layer.py): an
autograd Function whose backward is the reversed exchange (its adjoint, tests/parallel/test_expert_parallel.py),
called here with this stage's explicit ep group. The split sizes come from AutoEP's
`compute_split_plan` (one all-to-all of the per-expert counts over the same group). Dropless
routing needs them on the host: the exchange's sizes are data (one device sync per layer, as in
AutoEP itself); nothing is ever dropped or padded to a capacity.

`route` is the one place that decides where an assignment goes; the negative controls replace it
(a capacity that drops assignments, a wrong destination) and must fail the parity checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Routes:
    """This rank's assignments, in the order they are sent.

    order        [N] indices into the flattened [T * top_k] assignments, sorted by expert
    token        [N] the token of each sent assignment
    counts       [E] assignments per (global) expert, what the split plan is built from
    """

    order: torch.Tensor
    token: torch.Tensor
    counts: torch.Tensor


def route(top_k_index: torch.Tensor, num_experts: int) -> Routes:
    """Every (token, expert) assignment, sorted by expert (stable: token order inside an expert)."""
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return Routes(order=order, token=order // top_k_index.shape[-1], counts=counts)


@dataclass
class Dispatched:
    """What combine needs: the routes, the split sizes, and each received row's local expert."""

    routes: Routes
    input_splits: list[int]
    output_splits: list[int]
    local_expert: torch.Tensor  # [R] local expert index of every received row


def dispatch(hidden: torch.Tensor, top_k_index: torch.Tensor, num_experts: int, group, ep: int,
             router=route) -> tuple[torch.Tensor, Dispatched]:
    """(the rows this rank's experts must process [R, H], the bookkeeping for `combine`)."""
    from deepspeed.module_inject.auto_ep_layer import _AllToAllV, compute_split_plan

    routes = router(top_k_index, num_experts)
    local = num_experts // ep
    plan = compute_split_plan(selected_experts=top_k_index, num_experts=num_experts, ep_size=ep,
                              num_local_experts=local, ep_group=group, num_tokens_per_expert=routes.counts)
    received = _AllToAllV.apply(group, hidden[routes.token], plan.input_splits, plan.output_splits)
    # from each source in turn, its rows for local expert 0, 1, ...: the counts it announced
    counts = plan.local_counts_by_source.reshape(-1).to(torch.long)
    ids = torch.arange(local, device=hidden.device).repeat(plan.local_counts_by_source.shape[0])
    local_expert = torch.repeat_interleave(ids, counts)
    return received, Dispatched(routes, list(plan.input_splits), list(plan.output_splits), local_expert)


def combine(expert_out: torch.Tensor, d: Dispatched, top_k_weights: torch.Tensor, group) -> torch.Tensor:
    """Each token's expert outputs weighted by its routing weights and summed: [T, H]."""
    from deepspeed.module_inject.auto_ep_layer import _AllToAllV

    back = _AllToAllV.apply(group, expert_out, d.output_splits, d.input_splits)  # [N, H], in route order
    weights = top_k_weights.reshape(-1)[d.routes.order].unsqueeze(-1).to(back.dtype)
    out = torch.zeros(top_k_weights.shape[0], expert_out.shape[-1], dtype=back.dtype, device=back.device)
    return out.index_add(0, d.routes.token, back * weights)
