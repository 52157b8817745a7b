"""Colocated schedule: every rank runs every stage; one micro-batch at a time.

Per micro-batch m:
    vision forward on this rank's vision share -> boundary exchange -> language forward and
    backward on this rank's language share -> vision backward through the boundary.
The boundary's backward runs inside the vision backward, on every rank, in the same order.
"""

from __future__ import annotations

from typing import Any, Sequence

from .stage_work import StageWork


class ColocatedSchedule(StageWork):
    def run(self, samples: Sequence[dict[str, Any]], n_labels: int, step: int) -> tuple[float, dict]:
        """All micro-batches of one step up to (not including) the last optimizer step.

        Returns (this rank's sum of token losses, boundary byte counts).
        """
        h = self.h
        bytes_ = {"sent": 0, "total": 0, "lower_bound": 0}
        loss_sum = 0.0
        for m in range(self.gas):
            inputs = self.boundary_inputs(samples, m)
            rows = self.vision_forward(samples, m, step)
            with h.timeline.span(f"boundary.rows[m={m}]", "boundary", step):
                rows_out = h.boundary.exchange(rows, inputs)
            fwd = h.boundary.last_forward
            bytes_["sent"] += fwd.bytes_sent
            bytes_["total"] += fwd.total_bytes_sent
            bytes_["lower_bound"] += fwd.lower_bound_bytes
            rows_in = rows_out.detach().requires_grad_(True)
            local, grad = self.language_step(samples, m, rows_in, n_labels, step)
            loss_sum += local
            # the boundary's backward exchange runs inside this backward
            self.vision_backward(rows_out, grad, m, step)
            bytes_["sent"] += h.boundary.last_backward.bytes_sent
            for stage in ("language", "vision"):
                self.micro_step(stage, m)
        return loss_sum, bytes_
