"""Step time of the two placements from per-micro-batch stage times (pure).

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
"""

from __future__ import annotations

from dataclasses import dataclass


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
