"""Disaggregated schedule: vision ranks and language ranks are disjoint and work at the same time.

Micro-batches flow through a two-stage pipeline. At tick k (k = 0 .. M):

    vision ranks                       language ranks
    forward(k)            ||           forward + backward(k-1)       (in parallel)
    ---------- exchange rows of k (vision -> language) -----------
    ---------- exchange grads of k-1 (language -> vision) ---------
    backward(k-1)                      (next tick: forward + backward(k))

Warm-up is tick 0 (only the vision forward of micro-batch 0), drain is tick M (only the language
work and vision backward of the last micro-batch): 1F1B for two stages. Every rank of the
boundary group calls the same two collectives per tick in the same order, whatever its stage,
so the schedule is deterministic and cannot deadlock; a dead or stuck peer makes the
collective fail after the process-group timeout instead of hanging.
"""

from __future__ import annotations

from typing import Any, Sequence

from .stage_work import StageWork


class DisaggregatedSchedule(StageWork):
    def run(self, samples: Sequence[dict[str, Any]], n_labels: int, step: int) -> tuple[float, dict]:
        h = self.h
        is_vision, is_language = "vision" in h.engines, "language" in h.engines
        bytes_ = {"sent": 0, "total": 0, "lower_bound": 0}
        loss_sum = 0.0
        inputs = [self.boundary_inputs(samples, m) for m in range(self.gas)]
        rows, rows_in, grads = {}, {}, {}
        for k in range(self.gas + 1):
            if is_vision and k < self.gas:
                rows[k] = self.vision_forward(samples, k, step)
            if is_language and k >= 1:
                local, grads[k - 1] = self.language_step(samples, k - 1, rows_in.pop(k - 1), n_labels, step)
                loss_sum += local
                self.micro_step("language", k - 1)
            if k < self.gas:
                with h.timeline.span(f"boundary.rows[m={k}]", "boundary", step):
                    out = h.boundary.exchange_rows(rows[k] if is_vision else self.empty_rows(), inputs[k])
                fwd = h.boundary.last_forward
                bytes_["sent"] += fwd.bytes_sent
                bytes_["total"] += fwd.total_bytes_sent
                bytes_["lower_bound"] += fwd.lower_bound_bytes
                if is_language:
                    rows_in[k] = out.requires_grad_(True)
            if k >= 1:
                with h.timeline.span(f"boundary.grads[m={k - 1}]", "boundary", step):
                    grad = h.boundary.exchange_grads(grads.pop(k - 1) if is_language else self.empty_rows(),
                                                     inputs[k - 1])
                bytes_["sent"] += h.boundary.last_backward.bytes_sent
                if is_vision:
                    self.vision_backward(rows.pop(k - 1), grad, k - 1, step)
                    self.micro_step("vision", k - 1)
        return loss_sum, bytes_
