"""Pipelined language stage (pp > 1): the language on 1F1B, every encoder around and inside it.

One step, on every rank in an order that is a pure function of the StepPlan:

- language: 1F1B over the pipeline stages with `micro_batches` micro-batches, in the order of
  DeepSpeed's own instruction stream (`deepspeed.runtime.pipe.schedule.TrainSchedule`: warm-up
  forwards, one-forward-one-backward, cool-down backwards, with the even/odd ordering of sends
  and receives that keeps blocking point-to-point deadlock-free). Activations go to the next
  pipeline stage and input gradients back to the previous one, point to point in the pp group
  (`isend` / blocking `recv`; every rank knows each tensor's shape from the plan: [b, s, H] of
  its dp share of the micro-batch, or with cp / sequence parallelism its sequence shard,
  pipeline_shapes.py; the last stage's loss is over that shard, labels shifted on the full
  sequence, as in pp 1).
- encoders, colocated (every rank holds every encoder and one pipeline stage): each pass's
  boundary exchange (rows to the FIRST pipeline stage only, the ranks that hold the embeddings,
  and the row gradients back) is a collective over every rank, entered by all of them at the
  start of the same 1F1B step; each rank's encoder forward and backward run in its own pipeline
  stage's idle steps (the fill and drain) where the order allows (fill_drain.py: where and why
  it cannot deadlock; pipeline_fill.py runs it). Where an encoder's own forward or backward is
  a collective with other pipeline stages (its tp group spanning them, ZeRO 2 or 3), its work
  stays in phases before and after the 1F1B instead (`encoder_work_is_local`).
- encoders in first_stage and disaggregated placement (no encoder rank holds a later pipeline
  stage): each pass runs inline, inside pipeline stage 0's 1F1B (`_Inline`): that is Megatron's
  single layout, and in disaggregated placement one 1F1B across the encoder and the pipeline
  stages.

Why not DeepSpeed's PipelineEngine, whose schedule this follows: it requires the model as a
PipelineModule of LayerSpecs and owns the whole model, its data and its optimizer step, while
here every pipeline stage is an engine next to the encoders' engines, stepped with one gradient
norm over all of them (optimizer_step/global_step.py). Its pure instruction schedule fits; its engine
does not.

Scaling (stage_work.py): the last pipeline stage hands DeepSpeed `local / N * dp * M` as in
pp 1; an earlier stage back-propagates `sum(out * grad)` with `scale_wrt_gas=False` (the
received gradient already carries that scaling), so every chunk's gradients, and the row
gradients that reach the encoders, are those of the pp-1 stage.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..stages.tied_embeddings import reduce_tied_gradients
from ..pipeline_parallel.zero3 import count_backward
from ..step.step_plan import StepPlan
from .one_f_one_b import OneFOneB
from .pipeline_fill import EncodersInPipeline, encoder_work_is_local
from .stage_work import StageWork


class PipelineSchedule(StageWork):
    # colocated: the encoders' work in the pipeline's fill and drain; False runs it in phases
    # around the 1F1B instead (fill_drain.py), the baseline benchmarks/bench_pipeline.py compares
    fill_drain = True
    _encoders_local: bool | None = None  # encoder_work_is_local(stages), set on the first step

    def run(self, samples: Sequence[dict[str, Any]], plan: StepPlan, n_labels: int, step: int) -> torch.Tensor | float:
        """One step's forward and backward work; this rank's loss sum (0 off the last pipeline stage)."""
        loss_sum = self._work(samples, plan, n_labels, step)
        # DeepSpeed's ReduceTiedGrads: a tied embedding's two copies (first and last pipeline
        # stage) sum their gradients, after every backward and before the gradient norm
        with self._span("pipeline.reduce_tied_grads", "pipeline", step):
            reduce_tied_gradients(self.stages.language)
        return loss_sum

    def _work(self, samples, plan: StepPlan, n_labels: int, step: int) -> torch.Tensor | float:
        language = self.stages.language
        if self._inline():
            inline = _Inline(self, samples, plan, step)
            if language.held:
                return self._pipeline(samples, plan, inline.arrived, n_labels, step, inline)[0]
            inline.replay(plan.micro_batches, language.layout.pp)  # an encoder-only rank
            return 0.0
        # colocated (mixed: an encoder colocated with every pipeline stage): pipeline_fill.py
        if self._encoders_local is None:  # a pure function of the config: decided once, not per step
            self._encoders_local = encoder_work_is_local(self.stages)
        fill = EncodersInPipeline(self, samples, plan, step, self.fill_drain and self._encoders_local)
        if not language.held:  # mixed: a rank of an encoder of its own
            fill.replay()
            return 0.0
        return self._pipeline(samples, plan, None, n_labels, step, fill=fill)[0]

    def micro_step(self, stage, index: int) -> None:
        """After every backward but a stage's last: backwards run back to back here (1F1B's
        cool-down, encoder passes run before or after the pipeline), so ZeRO 3 must count each one now
        (pipeline_parallel/zero3.py), then DeepSpeed's micro-step."""
        if index < stage.passes - 1:
            count_backward(stage.engine)
        super().micro_step(stage, index)

    def _inline(self) -> bool:
        """Whether every encoder's exchange leaves out the later pipeline stages (first_stage and
        disaggregated placement): then each encoder pass runs inside pipeline stage 0's 1F1B,
        its forward and exchange right before stage 0's forward of its micro-batch, its gradient
        exchange and backward right after stage 0's backward of it (Megatron's first-stage
        layout; disaggregated: the encoder's ranks replay stage 0's order, so encoder pass m+1
        runs while stage 0 computes micro-batch m). The config gives every encoder one pass per
        language micro-batch in these placements."""
        language = self.stages.language.layout
        later = set(language.ranks[language.chunk_size:])
        return not any(later & set(e.layout.ranks) for e in self.stages.encoders)

    def _row_grads(self, rows) -> dict[str, torch.Tensor]:
        """Pipeline stage 0's gradients of the rows of every encoder that trains (a frozen one
        gets none back: no gradient exchange, no backward)."""
        return {e.name: r.grad if r.grad is not None else torch.zeros_like(r)
                for e, r in zip(self.stages.encoders, rows) if e.trains}

    # ------------------------------------------------------------------ 1F1B
    def _pipeline(self, samples, plan: StepPlan, arrived, n_labels: int, step: int, inline=None, fill=None):
        """This rank's pipeline stage through DeepSpeed's 1F1B instruction stream (one_f_one_b.py);
        (loss sum, row gradients of pipeline stage 0)."""
        return OneFOneB(self, samples, plan, arrived, n_labels, step, inline, fill).run()


class _Inline:
    """Encoder passes inside pipeline stage 0's 1F1B (see PipelineSchedule._inline)."""

    def __init__(self, work: PipelineSchedule, samples, plan: StepPlan, step: int):
        self.work, self.samples, self.plan, self.step = work, samples, plan, step
        self.arrived: dict[int, dict[str, torch.Tensor]] = {}
        self.sources: dict[tuple[str, int], torch.Tensor] = {}

    def forward(self, m: int) -> None:
        """Every encoder's pass m: its forward where held, its exchange on every rank of it."""
        w, plan = self.work, self.plan
        self.arrived[m] = {}
        for stage in w.stages.encoders:
            if stage.name not in w.boundaries:  # another encoder's exchange (disaggregated: its ranks and stage 0's)
                continue
            v = plan.pass_feeding(stage.name, m).index
            rows = w.encoder_forward(stage, self.samples, plan, v, self.step) if stage.held else w.empty_rows()
            if stage.held and stage.trains:  # kept for its backward
                self.sources[stage.name, v] = rows
            out = w.send_rows(stage.name, rows.detach() if stage.held else rows, plan, v, self.step)
            self.arrived[m][stage.name] = out.requires_grad_(stage.trains)

    def backward(self, m: int, grads: dict[str, torch.Tensor] | None) -> None:
        """Every encoder's pass m: its row gradients back, then its backward where held (none for
        an encoder that does not train: no exchange either, on every rank alike)."""
        w, plan = self.work, self.plan
        self.arrived.pop(m, None)
        for stage in w.stages.encoders:
            if stage.name not in w.boundaries or not stage.trains:
                continue
            v = plan.pass_feeding(stage.name, m).index
            grad = grads[stage.name] if grads is not None else w.empty_rows()
            grad = w.send_grads(stage.name, grad, plan, v, self.step)
            if stage.held:
                w.encoder_backward(stage, self.sources.pop((stage.name, v)), grad, plan, v, self.step)
                w.micro_step(stage, v)

    def replay(self, micro_batches: int, pp: int) -> None:
        """An encoder-only rank: pipeline stage 0's forwards and backwards, in its order."""
        from deepspeed.runtime.pipe import schedule as ds

        of_buffer, next_forward = {}, 0
        for cmds in ds.TrainSchedule(micro_batches=micro_batches, stages=pp, stage_id=0).steps():
            for cmd in cmds:
                if isinstance(cmd, ds.ForwardPass):
                    of_buffer[cmd.buffer_id] = next_forward
                    self.forward(next_forward)
                    next_forward += 1
                elif isinstance(cmd, ds.BackwardPass):
                    self.backward(of_buffer[cmd.buffer_id], None)
