"""A step's time from per-pass stage times, per placement and pipeline (pure): how the engine's
schedules order the stages' work on their ranks.

Without a language pipeline:

Colocated: every rank runs, per micro-batch, the vision forward, the boundary, the language
forward and backward, the boundary gradients and the vision backward, one after the other.

Disaggregated (schedule/disaggregated.py, a two-stage 1F1B over M micro-batches): at tick k
the vision ranks run the forward of k (and the backward of k-1 after the gradient exchange)
while the language ranks run forward + backward of k-1; two boundary exchanges per tick join
them. With Tv = vision forward + backward and Tl = language forward + backward per micro-batch:

    pipeline = Tv + Tl + (M - 1) max(Tv, Tl) + M (exchange rows + exchange gradients)

the first Tv and the last Tl being the fill and the drain. Each rank set then reduces its
gradients and steps its optimizer; the language ranks start that while the vision ranks still
run the last vision backward.

With a pipelined language stage, and with fewer encoder passes:

1F1B over S stages with per-micro-batch times t_s (forward + backward of one micro-batch on
stage s) and M micro-batches: the slowest stage is busy M max(t), and the first micro-batch
must cross every other stage before, and its last backward after, so

    pipeline = (M - 1) max_s t_s + sum_s t_s            (= (M + S - 1) t when balanced)

Every stage idles sum_s t_s - t_s per step (the fill and drain bubble).

Placements:
  first_stage   (Megatron's single layout) the encoder runs inside every micro-batch of the first
                stage: t_0 += encoder forward + backward of that micro-batch; a tuned cut gives
                the first stage fewer decoder layers to even it out.
  colocated     the encoder on every rank in its own layout (DESIGN: outside the pipeline, its
                work ordered into the fill and drain): the first pass's forward precedes the
                pipeline and the last pass's backward follows it; the other passes run in the
                idle time of the slowest stage where there is some, and add to it where not:
                    vf + vb + max(pipeline, M max(t) + (P - 1)(vf + vb))
                This is the best such an ordering can do (an optimistic bound). Several encoders on
                every rank (step_model.py): each one's first forward and last backward outside,
                their other passes in the idle time (`colocated_encoders_step`).
  disaggregated the encoder ranks are one more stage ahead of the language's: 1F1B over
                [encoder] + language stages (P = M).
Without a pipeline (pp = 1) these reduce to the colocated and disaggregated steps above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class StageTimes:
    """Seconds of one stage on one of its ranks."""

    forward: float  # per micro-batch: compute + tp/cp collectives of the forward
    backward: float  # per micro-batch, including per-micro-batch gradient reduction (ZeRO 2/3)
    step: float  # per step: gradient reduction at the boundary (ZeRO 0/1), optimizer

    @property
    def per_micro_batch(self) -> float:
        return self.forward + self.backward


def colocated_step(v: StageTimes, l: StageTimes, boundary: float, m: int) -> tuple[float, float]:
    """(step seconds, busy seconds per rank)."""
    busy = m * (v.per_micro_batch + l.per_micro_batch) + v.step + l.step
    return busy + m * boundary, busy


def disaggregated_step(v: StageTimes, l: StageTimes, boundary: float, m: int) -> tuple[float, float, float]:
    """(step seconds, busy seconds of a vision rank, busy seconds of a language rank)."""
    tv, tl = v.per_micro_batch, l.per_micro_batch
    pipeline = tv + tl + (m - 1) * max(tv, tl) + m * boundary
    end = max(pipeline + v.step, pipeline - v.backward + l.step)
    return end, m * tv + v.step, m * tl + l.step


def one_f_one_b(per_micro_batch: Sequence[float], m: int) -> float:
    """Makespan of 1F1B over stages with these per-micro-batch times."""
    return (m - 1) * max(per_micro_batch) + sum(per_micro_batch)


def colocated_pipeline_step(v: StageTimes, chunks: Sequence[StageTimes], boundary: float, m: int, passes: int
                            ) -> tuple[float, float]:
    """(step seconds, busy seconds of the busiest rank): the encoder on every rank, P passes."""
    return colocated_encoders_step([(v, passes, boundary)], chunks, m)


def colocated_encoders_step(encoders: Sequence[tuple[StageTimes, int, float]], chunks: Sequence[StageTimes], m: int
                            ) -> tuple[float, float]:
    """(step seconds, busy seconds of the busiest rank): several encoders on every rank, each given as
    (its times per pass, its passes P_e, seconds of one of its exchanges). Each encoder's first
    forward precedes the pipeline and its last backward follows it; its other P_e - 1 passes fill
    the slowest stage's idle time (one encoder: `colocated_pipeline_step`'s formula):

        sum_e t_e + max(pipeline, M max(t) + sum_e (P_e - 1) t_e) + sum_e P_e x exchange_e
    """
    t = [c.per_micro_batch for c in chunks]
    work = sum(p * v.per_micro_batch for v, p, _ in encoders)
    exchanges = sum(p * b for _, p, b in encoders)
    v_steps = sum(v.step for v, _, _ in encoders)
    if len(t) == 1:
        busy = work + m * t[0]
        return busy + exchanges + v_steps + chunks[0].step, busy + v_steps + chunks[0].step
    pipe = one_f_one_b(t, m)
    inner = max(pipe, m * max(t) + sum((p - 1) * v.per_micro_batch for v, p, _ in encoders))
    steps = v_steps + max(c.step for c in chunks)
    busy = work + m * max(t) + steps
    return sum(v.per_micro_batch for v, _, _ in encoders) + inner + exchanges + steps, busy


def first_stage_step(v: StageTimes, chunks: Sequence[StageTimes], m: int) -> tuple[float, float]:
    """(step seconds, busy seconds of a first-stage rank): the encoder inside stage 0, once per micro-batch."""
    t = [c.per_micro_batch for c in chunks]
    t[0] += v.per_micro_batch
    steps = max([chunks[0].step + v.step] + [c.step for c in chunks[1:]])
    return one_f_one_b(t, m) + steps, m * t[0] + chunks[0].step + v.step


def disaggregated_pipeline_step(v: StageTimes, chunks: Sequence[StageTimes], boundary: float, m: int
                                ) -> tuple[float, float, float]:
    """(step seconds, busy seconds of an encoder rank, of the busiest language rank)."""
    t = [v.per_micro_batch] + [c.per_micro_batch for c in chunks]
    pipe = one_f_one_b(t, m) + m * boundary
    steps = max(c.step for c in chunks)
    return pipe + max(v.step, steps), m * t[0] + v.step, m * max(t[1:]) + steps
