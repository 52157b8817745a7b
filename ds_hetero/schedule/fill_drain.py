"""Where a colocated encoder's work goes inside a pipelined language stage's 1F1B (pure).

In colocated placement every rank holds every encoder and one pipeline stage of the language
stage, and an encoder pass's boundary exchange (rows to the first pipeline stage, row gradients
back) is a collective over every rank. 1F1B keeps the pipeline stages at different
micro-batches, so the question is where all of them can meet.

DeepSpeed's `TrainSchedule` is lock-step: it yields a list of commands per step index t, and
every receive of step t is matched by a send of step t of the neighbouring stage (sends are
`isend` here, and a step's sends come before its receives wherever both appear, so a step's
commands complete once both neighbours have started that step). Hence every rank can finish
step t once every rank has started it, and a collective that every rank enters at the START of
the same step index, before its commands, cannot deadlock, whatever the stage
(tests/test_pipeline_fill_drain.py simulates it). So:

- pass k's rows exchange at the start of the step where pipeline stage 0 runs the forward of
  the first micro-batch pass k feeds; its gradient exchange at the start of the step after
  stage 0's backward of the last micro-batch it feeds (the step after the last, `steps`, is the
  end of the 1F1B);
- each rank's encoder forward of pass k in an idle step of ITS pipeline stage before that
  exchange (a step without a forward or backward: the later stages' fill, stage 0's steps while
  its first activations travel), or right before the exchange when none is left; its encoder
  backward in an idle step at or after the gradient exchange (the earlier stages' drain), or
  right after the exchange. One encoder work item per idle step, so an idle step grows by about
  one encoder pass at most.

Forwards take the earliest free idle step, pass after pass; backwards the latest, from the last
pass back (the mirror image). The first pass's forward (its rows are the first micro-batch's
input) and the last pass's backward (its gradients are the last micro-batch's) cannot move into
the pipeline. Every encoder's exchanges of one step run in config order, gradients before rows.

The order is a pure function of (passes' feeds, micro-batches, pp, stage), so every rank derives
the same exchange sequence; the encoders' compute may sit at different steps on different ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

Work = tuple[str, str, int]  # (kind, encoder stage, pass index); kind: forward, rows, grads, backward


@dataclass(frozen=True)
class FillDrainOrder:
    """One pipeline stage's encoder work around the 1F1B of one step.

    steps   the 1F1B's step count; index `steps` is after its last step
    before  step -> work at its start, before its 1F1B commands (exchanges, and encoder work
            that found no idle step)
    after   step -> encoder work after its commands (only on this stage's idle steps)
    """

    steps: int
    before: dict[int, list[Work]] = field(default_factory=dict)
    after: dict[int, list[Work]] = field(default_factory=dict)

    def exchanges(self) -> list[tuple[int, str, str, int]]:
        """(step, kind, stage, pass) of every collective, in the order this rank enters them."""
        return [(t, *w) for t in sorted(self.before) for w in self.before[t] if w[0] in ("rows", "grads")]


def train_steps(micro_batches: int, pp: int, stage_id: int) -> list[list]:
    """DeepSpeed's 1F1B instruction stream of one pipeline stage, one command list per step."""
    from deepspeed.runtime.pipe import schedule as ds

    return list(ds.TrainSchedule(micro_batches=micro_batches, stages=pp, stage_id=stage_id).steps())


def compute_steps(steps: Sequence[Sequence]) -> tuple[list[int], list[int], list[bool]]:
    """(step of each micro-batch's forward, step of each one's backward, whether each step computes)."""
    from deepspeed.runtime.pipe import schedule as ds

    forwards, backwards, busy = [], [], []
    for t, cmds in enumerate(steps):
        f = any(isinstance(c, ds.ForwardPass) for c in cmds)
        b = any(isinstance(c, ds.BackwardPass) for c in cmds)
        forwards += [t] * f
        backwards += [t] * b  # 1F1B runs the backwards in micro-batch order, as the forwards
        busy.append(f or b)
    return forwards, backwards, busy


def fill_drain_order(feeds: Mapping[str, Sequence[range]], micro_batches: int, pp: int,
                     stage_id: int, fill: bool = True) -> FillDrainOrder:
    """The order of every encoder pass's work on a rank of pipeline stage `stage_id`.

    `feeds`: per encoder stage, in config order, the language micro-batches each of its passes
    feeds (StepPlan.passes[name][k].feeds). `fill=False`: the phased order instead, every
    forward and rows exchange before the 1F1B and every gradient exchange and backward after
    it (what ran before this order; kept as the benchmark's baseline).
    """
    if not fill:
        return _phased(feeds, len(train_steps(micro_batches, pp, stage_id)))
    first, last, _ = compute_steps(train_steps(micro_batches, pp, 0))
    steps = train_steps(micro_batches, pp, stage_id)
    _, _, busy = compute_steps(steps)
    total = len(steps)
    rank_of = {name: i for i, name in enumerate(feeds)}
    rows_at = {(n, k): first[f.start] for n, fs in feeds.items() for k, f in enumerate(fs)}
    grads_at = {(n, k): last[f.stop - 1] + 1 for n, fs in feeds.items() for k, f in enumerate(fs)}
    order = FillDrainOrder(total)
    add = lambda where, t, w: where.setdefault(t, []).append(w)  # noqa: E731
    # exchanges first: every rank enters them in this order
    for (n, k), t in sorted(grads_at.items(), key=lambda x: (x[1], rank_of[x[0][0]], x[0][1])):
        add(order.before, t, ("grads", n, k))
    idle = [t for t in range(total) if not busy[t]]
    for (n, k), t in sorted(rows_at.items(), key=lambda x: (x[1], rank_of[x[0][0]], x[0][1])):
        slot = next((s for s in idle if s < t), None)
        if slot is None:
            add(order.before, t, ("forward", n, k))
        else:
            idle.remove(slot)
            add(order.after, slot, ("forward", n, k))
        add(order.before, t, ("rows", n, k))
    for (n, k), t in sorted(grads_at.items(), key=lambda x: (-x[1], -rank_of[x[0][0]], -x[0][1])):
        slot = next((s for s in reversed(idle) if s >= t), None)
        if slot is None:  # right after its gradient exchange: after the grads, before any rows
            work = order.before[t]
            work.insert(max(i for i, w in enumerate(work) if w[:3] == ("grads", n, k)) + 1, ("backward", n, k))
        else:
            idle.remove(slot)
            add(order.after, slot, ("backward", n, k))
    return order


def _phased(feeds: Mapping[str, Sequence[range]], steps: int) -> FillDrainOrder:
    items = [(n, k) for n, fs in feeds.items() for k in range(len(fs))]
    return FillDrainOrder(steps, before={
        0: [w for n, k in items for w in (("forward", n, k), ("rows", n, k))],
        steps: [w for n, k in items for w in (("grads", n, k), ("backward", n, k))]})
