"""Step time with a pipelined language stage, and with fewer encoder passes (pure).

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
                every rank (multi_predict.py): each one's first forward and last backward outside,
                their other passes in the idle time (`colocated_encoders_step`).
  disaggregated the encoder ranks are one more stage ahead of the language's: 1F1B over
                [encoder] + language stages (P = M).
Without a pipeline (pp = 1) these reduce to pipeline.py's colocated and disaggregated steps.
"""

from __future__ import annotations

from typing import Sequence

from .pipeline import StageTimes


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
