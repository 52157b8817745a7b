"""Colocated encoders inside a pipelined language stage's 1F1B: the runner of a FillDrainOrder.

PipelineSchedule calls `before(t)` at the start of every 1F1B step t (and `before(steps)` after
the last), `after(t)` after each step's commands, and hands over pipeline stage 0's row
gradients of every micro-batch as its backward produces them (`row_grads`). Where each piece
of encoder work runs, and why it cannot deadlock, is fill_drain.py's.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..step.step_plan import StepPlan
from .fill_drain import Work, fill_drain_order


def encoder_work_is_local(stages) -> bool:
    """Whether every encoder's forward and backward are free of collectives with other pipeline
    stages, so that fill_drain.py may run them at different 1F1B steps on different ranks (its
    exchanges are the only collectives it places). Not so when an encoder's tensor- or
    context-parallel group spans pipeline stages, or under ZeRO 2 or 3 (ZeRO 3 gathers the
    encoder's parameters over its dp group in every forward; ZeRO 2 reduce-scatters gradients in
    every backward; ZeRO 0 and 1 reduce only at the last pass, which never moves). Then the
    phased order runs instead. A pure function of the config, so every rank decides alike."""
    language = stages.language.layout
    pipeline_stage = {r: language.coord(r).pp for r in language.ranks}
    for encoder in stages.encoders:
        if encoder.trains and stages.config.zero_stage_of(encoder.name) >= 2:
            return False
        for group in encoder.layout.tp_groups() + encoder.layout.cp_groups():
            if len({pipeline_stage.get(r) for r in group}) > 1:
                return False
    return True


class EncodersInPipeline:
    def __init__(self, work, samples: Sequence[dict[str, Any]], plan: StepPlan, step: int, fill: bool = True):
        self.work, self.samples, self.plan, self.step = work, samples, plan, step
        language = work.stages.language
        # the order of every encoder, so that every rank derives the same one; this rank runs the
        # work of the encoders whose exchange it is in (colocated: all; mixed: see below)
        names = [s.name for s in work.stages.encoders]
        # a rank without the language stage (mixed placement: an encoder on ranks of its own)
        # follows pipeline stage 0's order of the exchanges it is in
        stage_id = language.coord.pp if language.held else 0
        # an encoder that does not train gets no gradient exchange and no backward (the same on every rank)
        frozen = {s.name for s in work.stages.encoders if not s.trains}
        self.order = fill_drain_order({n: [p.feeds for p in plan.passes[n]] for n in names},
                                      plan.micro_batches, language.layout.pp, stage_id, fill, frozen)
        self.first = language.held and language.coord.pp == 0  # holds the embeddings: receives rows
        self.arrived: dict[int, dict[str, torch.Tensor]] = {m: {} for m in range(plan.micro_batches)}
        self.row_grads: dict[int, dict[str, torch.Tensor]] = {}  # filled by stage 0's backwards
        self.sources: dict[tuple[str, int], torch.Tensor] = {}  # encoder rows kept for the backward
        self.grads: dict[tuple[str, int], torch.Tensor] = {}  # row gradients back, until the backward

    @property
    def steps(self) -> int:
        return self.order.steps

    def before(self, t: int) -> None:
        for w in self.order.before.get(t, ()):
            self._run(w)

    def after(self, t: int) -> None:
        for w in self.order.after.get(t, ()):
            self._run(w)

    def replay(self) -> None:
        """A rank without the language stage: the order's encoder work and exchanges, no 1F1B."""
        for t in range(self.steps + 1):
            self.before(t)
            self.after(t)

    def _run(self, w: Work) -> None:
        kind, name, k = w
        work, plan, stage = self.work, self.plan, self.work.stages[name]
        if name not in work.boundaries:  # mixed: an encoder of other ranks, not exchanging with this one
            return
        if kind == "forward":
            if stage.held:
                self.sources[name, k] = work.encoder_forward(stage, self.samples, plan, k, self.step)
        elif kind == "rows":
            # a frozen encoder's rows are not kept: it has no backward to take them
            held = (self.sources[name, k] if stage.trains else self.sources.pop((name, k))) if stage.held else None
            rows = held.detach() if stage.held else work.empty_rows()
            out = work.send_rows(name, rows, plan, k, self.step)
            if self.first:  # the rows of every language micro-batch the pass feeds, as leaves
                feeds = plan.encoder_pass(name, k).feeds
                dp = work.stages.language.coord.dp
                sizes = [plan.rows_of(name, dp, m) for m in feeds] if len(feeds) > 1 else [out.shape[0]]
                for m, piece in zip(feeds, out.split(sizes)):
                    self.arrived[m][name] = piece.detach().requires_grad_(stage.trains)
        elif kind == "grads":
            feeds = plan.encoder_pass(name, k).feeds
            grad = torch.cat([self._take(m, name) for m in feeds]) if self.first else work.empty_rows()
            self.grads[name, k] = work.send_grads(name, grad, plan, k, self.step)
        elif kind == "backward":
            grad = self.grads.pop((name, k))
            if stage.held:
                work.encoder_backward(stage, self.sources.pop((name, k)), grad, plan, k, self.step)
                work.micro_step(stage, k)

    def _take(self, m: int, name: str) -> torch.Tensor:
        grads = self.row_grads[m]
        g = grads.pop(name)
        if not grads:
            del self.row_grads[m]
        self.arrived[m].pop(name, None)
        return g
