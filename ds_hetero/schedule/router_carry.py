"""A mixture-of-experts language stage's router statistics, carried between its pipeline stages.

The load-balancing loss is a product of sums over every MoE layer of the forward
(expert_parallel/aux_loss.py), so with pp > 1 each pipeline stage adds its own layers' partial
sums to the ones it received and sends the total on, right after its hidden states and to the
same neighbour (one fp32 vector of `stats_size(E)` floats, whatever the hidden states' dtype: the
counts must stay whole numbers). The last pipeline stage forms its share of the aux loss from
them; in the backward the vector's gradient goes back right after the hidden states' gradient,
so every pipeline stage's backward gets the gradient of its own layers' router probabilities.
Both sides know the vector's size from the model's config, so nothing but the vector is sent.
The one collective (the counts summed over the stage's dp x cp ranks, aux_group) runs on the
last pipeline stage only, entered by all its dp x cp ranks at the same 1F1B instruction.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..expert_parallel import aux_of_carried, carry_router_stats
from ..expert_parallel.aux_loss import stats_size
from ..step.step_plan import StepPlan


class RouterCarry:
    """What one rank's pipeline stage does with the carried statistics of each micro-batch
    (`s`: OneFOneB's state of the micro-batch: "carry_in" received, "carry" sent on)."""

    def __init__(self, work, experts: int):
        self.work, self.experts = work, experts
        self.language = work.stages.language
        self.groups, _, self.tp_group = work.aux_group()
        self.size = stats_size(experts)

    def empty(self) -> torch.Tensor:
        return torch.empty(self.size, dtype=torch.float32, device=self.work.stages.device)

    def recv(self, s: dict[str, Any], src: int, group) -> None:
        c = self.empty()
        dist.recv(c, src, group=group)
        s["carry_in"] = c.requires_grad_(torch.is_grad_enabled())

    def forward(self, s: dict[str, Any]) -> None:
        """After this stage's forward of the micro-batch: the statistics to send on."""
        s["carry"] = carry_router_stats(self.language.module, s.get("carry_in"), self.experts,
                                        self.work.stages.device, self.groups, self.language.layout.pp)

    def add_aux(self, local: torch.Tensor, s: dict[str, Any], plan: StepPlan, n_labels: int) -> torch.Tensor:
        """The last pipeline stage: its loss sum plus its share of the micro-batch's aux loss."""
        aux = aux_of_carried(s.pop("carry"), self.experts, self.groups, self.tp_group)
        return self.work.add_aux(local, aux, plan, n_labels)

    def surrogate(self, s: dict[str, Any]) -> torch.Tensor:
        """An earlier stage's backward term of the statistics it sent: sum(carry * its gradient)."""
        return (s.pop("carry") * s.pop("carry_grad")).sum()

    def recv_grad(self, s: dict[str, Any], src: int, group) -> None:
        g = self.empty()
        dist.recv(g, src, group=group)
        s["carry_grad"] = g

    def input_grad(self, s: dict[str, Any]) -> torch.Tensor:
        """The gradient of the received statistics, to send back (zeros where nothing reached them)."""
        c = s["carry_in"]
        return (c.grad if c.grad is not None else torch.zeros_like(c)).contiguous()
