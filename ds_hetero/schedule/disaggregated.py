"""Disaggregated schedule: encoder ranks and language ranks are disjoint and work at the same time.

Micro-batches flow through a two-stage pipeline (every encoder stage, then the language
stage). At tick k (k = 0 .. M):

    encoder ranks                      language ranks
    forward(k)            ||           forward + backward(k-1)       (in parallel)
    ---------- exchange rows of k (encoders -> language), one exchange per encoder ----
    ---------- exchange grads of k-1 (language -> encoders), one per encoder ----------
    backward(k-1)                      (next tick: forward + backward(k))

Warm-up is tick 0 (only the encoder forwards of micro-batch 0), drain is tick M (only the
language work and encoder backwards of the last micro-batch): 1F1B for two stages. Every rank
of an encoder's pair group (that encoder's and the language stage's ranks) calls the pair's
exchanges per tick in the same order, encoders in config order, whatever its stages, so the
schedule is deterministic and cannot deadlock; a dead or stuck peer makes the
collective fail after the process-group timeout instead of hanging. (The config gives every
encoder as many passes as language micro-batches in this placement.) Placement "mixed" runs
here too: an encoder colocated with the language stage is a pair whose exchange copies its rows
locally; its forward of micro-batch k runs before the language work on k-1, on the same ranks.
An encoder that does not train (`Stage.trains`) has no gradient exchange: every rank skips it
alike (it is config and model state, the same on all ranks).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..step.step_plan import StepPlan
from .stage_work import StageWork


class DisaggregatedSchedule(StageWork):
    def run(self, samples: Sequence[dict[str, Any]], plan: StepPlan, n_labels: int, step: int) -> torch.Tensor | float:
        language = self.stages.language
        encoders = self.stages.encoders
        n = plan.micro_batches
        loss_sum = 0.0
        rows: dict[tuple[str, int], torch.Tensor] = {}  # (encoder, micro-batch) -> its rows, until its backward
        rows_in: dict[int, list[torch.Tensor]] = {}
        grads: dict[int, list[torch.Tensor]] = {}
        for k in range(n + 1):
            for stage in encoders:
                if stage.held and k < n:
                    rows[stage.name, k] = self.encoder_forward(stage, samples, plan, k, step)
            if language.held and k >= 1:
                local, grads[k - 1] = self.language_step(samples, plan, k - 1, rows_in.pop(k - 1), n_labels, step)
                loss_sum += local
                self.micro_step(language, k - 1)
            # Only the encoders whose pair group this rank is in (all of them on a language rank),
            # in config order: each pair's ranks call its exchanges in the same order.
            paired = [s for s in encoders if s.name in self.boundaries]
            if k < n:
                arrived = [self.send_rows(s.name, rows[s.name, k] if s.held else self.empty_rows(), plan, k, step)
                           for s in paired]
                if language.held:
                    rows_in[k] = [r.requires_grad_(s.trains) for s, r in zip(paired, arrived)]
            if k >= 1:
                back = grads.pop(k - 1) if language.held else [self.empty_rows() for _ in paired]
                for stage, grad in zip(paired, back, strict=True):
                    if not stage.trains:
                        rows.pop((stage.name, k - 1), None)
                        continue
                    grad = self.send_grads(stage.name, grad, plan, k - 1, step)
                    if stage.held:
                        self.encoder_backward(stage, rows.pop((stage.name, k - 1)), grad, plan, k - 1, step)
                        self.micro_step(stage, k - 1)
        return loss_sum
