"""Colocated schedule: every rank runs every stage; one micro-batch at a time.

Per vision micro-batch v (`stages.vision.micro_batches`, default: one per language micro-batch):
    vision forward on this rank's images of v -> one boundary exchange -> for each language
    micro-batch m that v feeds: language forward and backward on this rank's share of m, its
    row gradients kept -> vision backward through the boundary, once, with all of them.
The boundary's backward runs inside the vision backward, on every rank, in the same order.
With fewer vision micro-batches the vision activations of gas / v_gas language micro-batches
stay alive until their vision backward (memory: see the README's token-balancing section).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .stage_work import StageWork


class ColocatedSchedule(StageWork):
    def run(self, samples: Sequence[dict[str, Any]], n_labels: int, step: int) -> tuple[float, dict]:
        """All micro-batches of one step up to (not including) the last optimizer step.

        Returns (this rank's sum of token losses, boundary byte counts).
        """
        h = self.h
        bytes_ = {"sent": 0, "total": 0, "lower_bound": 0}
        loss_sum = 0.0
        for v in range(self.v_gas):
            inputs = self.boundary_inputs(samples, v)
            rows = self.vision_forward(samples, v, step)
            with h.timeline.span(f"boundary.rows[m={v}]", "boundary", step):
                rows_out = h.boundary.exchange(rows, inputs)
            fwd = h.boundary.last_forward
            bytes_["sent"] += fwd.bytes_sent
            bytes_["total"] += fwd.total_bytes_sent
            bytes_["lower_bound"] += fwd.lower_bound_bytes
            # the rows arrive in sample order: language micro-batch after language micro-batch
            ms = self.language_micro_batches(v)
            # (one language micro-batch per pass takes all rows: its sequence shard's, when sharded)
            sizes = [self.language_rows(samples, m) for m in ms] if len(ms) > 1 else [rows_out.shape[0]]
            pieces = rows_out.detach().split(sizes)
            grads = []
            for m, piece in zip(ms, pieces):
                local, grad = self.language_step(samples, m, piece.detach().requires_grad_(True), n_labels, step)
                loss_sum += local
                grads.append(grad)
                self.micro_step("language", m)
            # the boundary's backward exchange runs inside this backward
            self.vision_backward(rows_out, torch.cat(grads), v, step)
            bytes_["sent"] += h.boundary.last_backward.bytes_sent
            self.micro_step("vision", v)
        return loss_sum, bytes_
