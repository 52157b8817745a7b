"""One step of this rank's pipeline stage on 1F1B, in the order of DeepSpeed's own instruction stream.

`deepspeed.runtime.pipe.schedule.TrainSchedule` gives, per 1F1B step, the instructions of this pipeline
stage (warm-up forwards, one-forward-one-backward, cool-down backwards, with the even/odd ordering of
sends and receives that keeps blocking point-to-point deadlock-free); `OneFOneB` executes them, one
method per instruction. Activations go to the next pipeline stage and input gradients back to the
previous one, point to point in the pp group (`isend` / blocking `recv`; every rank knows each tensor's
shape from the plan: pipeline_parallel/hidden_shape.py). The encoders' work joins in through `inline`
(first_stage and disaggregated: stage 0's forward and backward of a micro-batch) or `fill` (colocated:
the pipeline's idle steps, pipeline_fill.py); pipeline.py says which and why. A mixture-of-experts
language stage's router statistics travel with the hidden states and their gradients (router_carry.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..loss import token_loss_sum
from ..pipeline_parallel.hidden_shape import hidden_shape as shard_shape
from ..step.step_plan import StepPlan
from .router_carry import RouterCarry
from .stage_work import segments_of


class OneFOneB:
    """The state of one step's 1F1B on this rank: micro-batches in flight, sends pending, the loss sum
    and the row gradients pipeline stage 0 hands back to the encoders."""

    def __init__(self, work, samples, plan: StepPlan, arrived, n_labels: int, step: int, inline=None, fill=None):
        self.work, self.samples, self.plan, self.n_labels, self.step = work, samples, plan, n_labels, step
        self.inline, self.fill = inline, fill
        self.language = language = work.stages.language
        self.coord, self.pp = language.coord, language.layout.pp
        neighbours = language.groups.ranks_of["pp"]  # this rank's (tp, cp, dp) in every pipeline stage
        self.prev = neighbours[self.coord.pp - 1] if self.coord.pp > 0 else None
        self.nxt = neighbours[self.coord.pp + 1] if self.coord.pp < self.pp - 1 else None
        self.group = language.groups.pp
        self.state: dict[int, dict[str, Any]] = {}  # micro-batch -> its batch, input, output, gradients
        self.of_buffer: dict[int, int] = {}  # DeepSpeed's pipe buffer -> the micro-batch it holds
        self.sends: list[tuple[Any, torch.Tensor]] = []  # isend handles, with their tensors kept alive
        self.loss_sum = 0.0
        self.arrived, self.row_grads = arrived, {}
        if fill is not None:
            self.arrived, self.row_grads = fill.arrived, fill.row_grads  # filled and emptied by the encoders' work
        self.next_forward = 0
        experts = work.adapter.router_experts  # with a MoE aux loss: its statistics travel too
        self.carry = RouterCarry(work, experts) if experts else None

    def run(self) -> tuple[Any, dict[int, dict[str, torch.Tensor]]]:
        from deepspeed.runtime.pipe import schedule as ds

        handlers = {ds.RecvActivation: self.recv_activation, ds.ForwardPass: self.forward,
                    ds.SendActivation: self.send_activation, ds.RecvGrad: self.recv_grad,
                    ds.BackwardPass: self.backward, ds.SendGrad: self.send_grad}
        fill = self.fill
        steps = ds.TrainSchedule(micro_batches=self.plan.micro_batches, stages=self.pp, stage_id=self.coord.pp)
        for t, cmds in enumerate(steps.steps()):
            if fill is not None:  # collectives every rank enters at the start of step t
                fill.before(t)
            for cmd in cmds:
                # LoadMicroBatch: batches are built where they are used; ReduceTiedGrads,
                # ReduceGrads, OptimizerStep: the engines reduce at the accumulation boundary
                # and optimizer_step/global_step.py takes the one clipped step over every stage.
                handler = handlers.get(type(cmd))
                if handler is not None:
                    handler(cmd.buffer_id)
            if fill is not None:  # encoder work in this stage's idle steps
                fill.after(t)
        if fill is not None:
            fill.before(fill.steps)  # the last passes' gradient exchanges and backwards
        with self.work._span("pipeline.drain_sends", "pipeline", self.step):
            for handle, _ in self.sends:
                handle.wait()
        return self.loss_sum, self.row_grads

    # ------------------------------------------------------------------ micro-batches
    def micro_batch(self, m: int) -> dict[str, Any]:
        if m not in self.state:
            batch, counts, sharded = self.work.language_micro_batch(self.samples, self.plan, self.coord.dp, m)
            self.state[m] = {"batch": batch, "counts": counts, "sharded": sharded}
        return self.state[m]

    def hidden_shape(self, m: int):
        """This rank's sequence shard of the hidden states (pipeline_parallel/hidden_shape.py), as wide as
        this rank's chunk takes them (what a family carries besides them included: PipelineChunk.input_width)."""
        s = self.micro_batch(m)
        return shard_shape(self.language.layout, s["batch"], s["sharded"], self.language.module.input_width)

    # ------------------------------------------------------------------ the instructions
    def recv_activation(self, buffer_id: int) -> None:
        m = self.of_buffer[buffer_id] = self.next_forward
        stages = self.work.stages
        x = torch.empty(self.hidden_shape(m), dtype=stages.dtype, device=stages.device)
        with self.work._span(f"pipeline.recv_activation[m={m}]", "pipeline", self.step):
            dist.recv(x, self.prev, group=self.group)
            if self.carry is not None:
                self.carry.recv(self.micro_batch(m), self.prev, self.group)
        self.micro_batch(m)["input"] = x.requires_grad_(True)

    def forward(self, buffer_id: int) -> None:
        m = self.of_buffer[buffer_id] = self.next_forward
        self.next_forward += 1
        first = self.coord.pp == 0
        if self.inline is not None and first:
            self.inline.forward(m)
        s = self.micro_batch(m)
        batch, language = s["batch"], self.language
        with self.work._span(f"language.forward[m={m}]", "forward", self.step):
            if first:
                rows = tuple(self.arrived[m][e.name] for e in self.work.stages.encoders)
                s["rows"] = rows
                out = language(batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"],
                               n_placeholders=s["counts"], **segments_of(batch))
            else:
                out = language(s["input"], (), batch["attention_mask"], batch["position_ids"],
                               input_ids=batch["input_ids"], **segments_of(batch))
            if self.carry is not None:
                self.carry.forward(s)
            if self.nxt is None:
                out = token_loss_sum(out, batch["labels"], self.work.lm_head, shifted=s["sharded"])
                if self.carry is not None:
                    out = self.carry.add_aux(out, s, self.plan, self.n_labels)
        s["output"] = out

    def send_activation(self, buffer_id: int) -> None:
        s = self.state[self.of_buffer[buffer_id]]
        y = s["output"].detach().contiguous()
        self.sends.append((dist.isend(y, self.nxt, group=self.group), y))
        if self.carry is not None:  # after the hidden states, to the same neighbour
            c = s["carry"].detach().contiguous()
            self.sends.append((dist.isend(c, self.nxt, group=self.group), c))

    def recv_grad(self, buffer_id: int) -> None:
        m = self.of_buffer[buffer_id]
        g = torch.empty_like(self.state[m]["output"])
        with self.work._span(f"pipeline.recv_grad[m={m}]", "pipeline", self.step):
            dist.recv(g, self.nxt, group=self.group)
            if self.carry is not None:
                self.carry.recv_grad(self.state[m], self.nxt, self.group)
        self.state[m]["output_grad"] = g

    def backward(self, buffer_id: int) -> None:
        m = self.of_buffer[buffer_id]
        s, language = self.state[m], self.language
        with self.work._span(f"language.backward[m={m}]", "backward", self.step):
            if self.nxt is None:
                local = s["output"]
                language.backward(local / self.n_labels * self.plan.language_scale())
                self.loss_sum += local.detach().double()
            else:  # the received gradient carries the last stage's scaling already
                surrogate = (s["output"] * s.pop("output_grad")).sum()
                if self.carry is not None:
                    surrogate = surrogate + self.carry.surrogate(s)
                with language.context():
                    language.engine.backward(surrogate, scale_wrt_gas=False)
        s.pop("output")
        first = self.coord.pp == 0
        if first:
            self.row_grads[m] = self.work._row_grads(s.pop("rows"))
            del self.state[m]
        self.work.micro_step(language, m)
        if self.inline is not None and first:
            self.inline.backward(m, self.row_grads.pop(m))

    def send_grad(self, buffer_id: int) -> None:
        s = self.state.pop(self.of_buffer.pop(buffer_id))
        x = s["input"]
        g = (x.grad if x.grad is not None else torch.zeros_like(x)).contiguous()
        self.sends.append((dist.isend(g, self.prev, group=self.group), g))
        if self.carry is not None:  # after the hidden states' gradient, to the same neighbour
            c = self.carry.input_grad(s)
            self.sends.append((dist.isend(c, self.prev, group=self.group), c))
