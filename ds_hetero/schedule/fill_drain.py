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
(tests/pipeline/test_pipeline_fill_drain.py simulates it). So:

- where a pass's work moves into the pipeline, its rows exchange runs at the start of the step
  where pipeline stage 0 runs the forward of the first micro-batch the pass feeds, its gradient
  exchange at the start of the step after stage 0's backward of the last micro-batch it feeds;
- each rank runs its encoder forward of such a pass in an idle step of ITS pipeline stage before
  that exchange (a step without a forward or backward: the later stages' fill, stage 0's steps
  while its first activations travel), its encoder backward in an idle step at or after the
  gradient exchange (the earlier stages' drain). One encoder pass per idle step, so an idle
  step grows by about one encoder pass at most. Forwards take the earliest free idle step,
  pass after pass; backwards the latest, from the last pass back (the mirror image).
- every other pass stays in phases around the 1F1B: its forward and rows exchange before it,
  its gradient exchange and backward after it. An exchange inside the 1F1B is a barrier over
  every rank, and 1F1B keeps the stages naturally skewed (a later stage runs its backward while
  an earlier one runs a forward): a barrier costs about that skew, a forward's time, so only
  the passes that some stage moves into an idle step get one. (benchmarks/model_pipeline_fill.py
  runs these programs on model clocks, forward f, backward 2f, encoder pass forward e_f per rank:
  phased / this order is 1.02-1.07 at pp 2 and 1.03-1.09 at pp 4 with e_f = 0.6f, 0.97-0.99 with
  e_f = 0.3f, where a filled idle step gains less than a barrier costs. An earlier version with
  an exchange inside the 1F1B for every pass gave 0.95 and 0.89 at pp 2 with 4 and 8
  micro-batches, e_f = 0.6f: slower than the phased order.)
  A pass whose exchange is inside but for which a stage has no idle step runs its forward
  before the 1F1B (its backward after it) on that stage.

An encoder that does not train (`frozen`: `freeze: true`, or nothing of it requires grad) has
no gradient exchange and no backward at all: only its forward and rows exchange are placed, and
its passes take no idle step for a backward.

The first pass's forward (its rows are the first micro-batch's input) and the last pass's
backward (its gradients are the last micro-batch's) cannot move into the pipeline. Every
encoder's exchanges of one step run in config order, gradients before rows.

The order is a pure function of (passes' feeds, micro-batches, pp, stage), so every rank derives
the same exchange sequence; the encoders' compute may sit at different steps on different ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

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
                     stage_id: int, fill: bool = True, frozen: Collection[str] = ()) -> FillDrainOrder:
    """The order of every encoder pass's work on a rank of pipeline stage `stage_id`.

    `feeds`: per encoder stage, in config order, the language micro-batches each of its passes
    feeds (StepPlan.passes[name][k].feeds). `fill=False`: the phased order instead, every
    forward and rows exchange before the 1F1B and every gradient exchange and backward after
    it (kept as the benchmark's baseline). `frozen`: the encoder stages that do not train (no
    gradient exchange, no backward).
    """
    total = len(train_steps(micro_batches, pp, stage_id))
    items = [(n, k) for n, fs in feeds.items() for k in range(len(fs))]  # config order, then pass order
    trained = [i for i in items if i[0] not in frozen]
    if not fill:
        return _phased(items, set(), set(), {}, {}, total, trained)
    first, last, _ = compute_steps(train_steps(micro_batches, pp, 0))
    rows_at = {(n, k): first[f.start] for n, fs in feeds.items() for k, f in enumerate(fs)}
    grads_at = {(n, k): last[f.stop - 1] + 1 for n, fs in feeds.items() for k, f in enumerate(fs)}
    slots = [_slots(items, trained, rows_at, grads_at, compute_steps(train_steps(micro_batches, pp, s))[2])
             for s in range(pp)]
    # an exchange inside the 1F1B is a barrier over every rank, which costs the stages' natural
    # skew in 1F1B: only the passes that some stage moves into an idle step get one
    inside_rows = {i for fwd, _ in slots for i in fwd}
    inside_grads = {i for _, bwd in slots for i in bwd}
    fwd, bwd = slots[stage_id]
    order = _phased(items, inside_rows, inside_grads, fwd, bwd, total, trained)
    key = lambda t, i: (t, items.index(i))  # noqa: E731 - exchanges of one step: config order, then pass
    for i in sorted(inside_grads, key=lambda i: key(grads_at[i], i)):
        order.before.setdefault(grads_at[i], []).append(("grads", *i))
    for i in sorted(inside_rows, key=lambda i: key(rows_at[i], i)):
        order.before.setdefault(rows_at[i], []).append(("rows", *i))
    for i, t in fwd.items():
        order.after.setdefault(t, []).append(("forward", *i))
    for i, t in bwd.items():
        order.after.setdefault(t, []).append(("backward", *i))
    return order


def _slots(items, trained, rows_at, grads_at, busy):
    """One stage's idle steps given to encoder work: ({pass: step of its forward},
    {pass: step of its backward}). Forwards take the earliest free idle step before their rows
    exchange, pass after pass; backwards the latest at or after their gradient exchange, from the
    last pass back (the mirror image)."""
    idle = [t for t in range(len(busy)) if not busy[t]]
    fwd, bwd = {}, {}
    for i in sorted(items, key=lambda i: (rows_at[i], items.index(i))):
        slot = next((t for t in idle if t < rows_at[i]), None)
        if slot is not None:
            idle.remove(slot)
            fwd[i] = slot
    for i in sorted(trained, key=lambda i: (-grads_at[i], -items.index(i))):
        slot = next((t for t in reversed(idle) if t >= grads_at[i]), None)
        if slot is not None:
            idle.remove(slot)
            bwd[i] = slot
    return fwd, bwd


def _phased(items, inside_rows, inside_grads, fwd, bwd, steps: int, trained) -> FillDrainOrder:
    """Every pass's work that stays outside the 1F1B: before it, the forwards of passes whose
    rows exchange is inside but that this stage has no idle step for, then every other pass's
    forward and rows exchange; after it, the backwards of passes whose gradient exchange was
    inside but that found no idle step here, then every other pass's gradient exchange and
    backward (the last pass's backward last: the accumulation boundary)."""
    head = [("forward", *i) for i in items if i in inside_rows and i not in fwd]
    head += [w for i in items if i not in inside_rows for w in (("forward", *i), ("rows", *i))]
    tail = [("backward", *i) for i in trained if i in inside_grads and i not in bwd]
    tail += [w for i in trained if i not in inside_grads for w in (("grads", *i), ("backward", *i))]
    return FillDrainOrder(steps, before={t: w for t, w in ((0, head), (steps, tail)) if w})
