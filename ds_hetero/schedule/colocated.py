"""Colocated schedule: every rank runs every stage; one language micro-batch at a time.

For each language micro-batch m, in order:
    every encoder pass that starts at m: its forward on this rank's items -> its boundary
    exchange (one per pass; the rows of all the micro-batches it feeds) -> language forward
    and backward on this rank's share of m, each encoder's row gradients kept -> every encoder
    pass that ends at m: its backward through the boundary, once, with all of its gradients.
The boundary's backward runs inside the encoder's backward, on every rank, in the same order.
With fewer encoder passes than language micro-batches (`stages.<name>.micro_batches`) an
encoder's activations stay alive until its pass's backward (memory: docs/balancing.md).
An encoder that does not train (`Stage.trains`, docs/memory.md) runs its forward without
autograd and its exchange one way only: no backward, no boundary gradient.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..step.step_plan import StepPlan
from .stage_work import StageWork


class ColocatedSchedule(StageWork):
    def run(self, samples: Sequence[dict[str, Any]], plan: StepPlan, n_labels: int, step: int) -> torch.Tensor | float:
        """All micro-batches of one step up to (not including) the last optimizer step.

        Returns this rank's sum of token losses; `self.bytes` counts the boundary bytes.
        """
        language = self.stages.language
        dp = language.coord.dp
        loss_sum = 0.0
        open_passes: dict[str, tuple] = {}  # stage -> (pass, its rows out, pieces per micro-batch, gradients)
        for m in range(plan.micro_batches):
            for stage in self.stages.encoders:
                p = plan.pass_feeding(stage.name, m)
                if p.feeds.start != m:
                    continue
                rows = self.encoder_forward(stage, samples, plan, p.index, step)
                out = self.send_rows(stage.name, rows, plan, p.index, step, differentiable=stage.trains)
                # the rows arrive in sample order: language micro-batch after language micro-batch,
                # each with this rank's sequence shard's rows only when the sequence is sharded
                sizes = ([plan.rows_of(stage.name, dp, k, self.stages.rank) for k in p.feeds] if len(p.feeds) > 1
                         else [out.shape[0]])
                open_passes[stage.name] = (p, out, out.detach().split(sizes), [])
            rows_in = [open_passes[s.name][2][m - open_passes[s.name][0].feeds.start].detach().requires_grad_(s.trains)
                       for s in self.stages.encoders]
            local, grads = self.language_step(samples, plan, m, rows_in, n_labels, step)
            loss_sum += local
            self.micro_step(language, m)
            for stage, grad in zip(self.stages.encoders, grads):
                p, out, _, kept = open_passes[stage.name]
                kept.append(grad)
                if m == p.feeds.stop - 1 and not stage.trains:
                    del open_passes[stage.name]
                elif m == p.feeds.stop - 1:  # the boundary's backward exchange runs inside this backward
                    self.encoder_backward(stage, out, torch.cat(kept), plan, p.index, step)
                    self.count_backward(stage.name)
                    self.micro_step(stage, p.index)
                    del open_passes[stage.name]
        return loss_sum
