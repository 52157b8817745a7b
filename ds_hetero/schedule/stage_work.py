"""The pieces of stage work every schedule is made of, for one pass or micro-batch of a StepPlan.

Scaling (shared by every schedule): DeepSpeed divides a backward's loss by
gradient_accumulation_steps and averages gradients over the stage's dp group. To end with the
gradient of
    L = (sum of token losses of the global batch) / (global label tokens)
the language loss handed to DeepSpeed is `local_sum / N * plan.language_scale()`; the row
gradients it produces therefore carry a factor dp_language, and an encoder's surrogate
`sum(rows * grad)` is scaled by `plan.encoder_scale(stage)` (its dp x passes / dp_language).

Each engine's backward enters only through its own `backward()` (the language stage consumes
detached leaves; an encoder stage back-propagates the surrogate), which DeepSpeed's ZeRO
stage 0 requires.

StageWork takes the narrow things it needs: the StageSet, one boundary communicator per
encoder stage, the model's adapter (inputs of each stage) and the timeline.
"""

from __future__ import annotations

import contextlib
from typing import Any, Mapping, Sequence

import torch

from ..boundary.inputs import num_shards
from ..context_parallel import is_sharded, shard_input_ids, shard_language_batch
from ..expert_parallel import take_aux_loss
from ..loss import token_loss_sum
from ..models.packing import packed_language_inputs
from ..models.per_sample_attention import PER_SAMPLE
from ..stages.stage_set import Stage, StageSet
from ..step.step_plan import StepPlan
from ..tensor_parallel import VocabParallelLMHead
from ..timeline import Timeline


def segments_of(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The language stage's `packed_segments` keyword for this batch (none for padded samples)."""
    segments = batch.get("packed_segments")
    return {} if segments is None else {"packed_segments": segments}


class StageWork:
    def __init__(self, stages: StageSet, boundaries: Mapping[str, Any], adapter, timeline: Timeline):
        self.stages, self.boundaries, self.adapter, self.timeline = stages, boundaries, adapter, timeline
        self.ports = adapter.encoders()
        head = stages.language.module.lm_head
        self.lm_head = head if isinstance(head, VocabParallelLMHead) else None
        self.loss_observer = None  # (logits, labels, shifted) -> None, called after each language loss
        self.start_counts()
        # packed rows attended per sample (models/per_sample_attention.py): the batch carries their segments
        self.per_sample = stages.config.packed and adapter.packed_attention(stages.config.packed_attention) == PER_SAMPLE

    def start_counts(self) -> None:
        """A step's counts from zero (the engine, before each step): boundary bytes, and the aux-loss
        shares of a MoE language stage."""
        self.bytes = {"sent": 0, "total": 0, "lower_bound": 0, "backward": 0, "backward_lower_bound": 0}
        self.aux_sum = 0.0

    def _span(self, name: str, category: str, step: int | None):
        """A timeline span of a training step; evaluation (step None) records none."""
        return contextlib.nullcontext() if step is None else self.timeline.span(name, category, step)

    def empty_rows(self) -> torch.Tensor:
        """`[0, H]` in the boundary dtype: what a rank passes for a side of an exchange it is not on."""
        return torch.zeros(0, self.adapter.hidden_size, dtype=self.stages.dtype, device=self.stages.device)

    # ------------------------------------------------------------------ boundary
    def send_rows(self, name: str, rows: torch.Tensor, plan: StepPlan, v: int, step: int,
                  differentiable: bool = False) -> torch.Tensor:
        """Encoder pass v's rows of stage `name` into the language layout (this rank's share)."""
        boundary = self.boundaries[name]
        inputs = plan.encoder_pass(name, v).boundary
        with self._span(f"boundary.rows[{name},m={v}]", "boundary", step):
            out = boundary.exchange(rows, inputs) if differentiable else boundary.exchange_rows(rows, inputs)
        fwd = boundary.last_forward
        self.bytes["sent"] += fwd.bytes_sent
        self.bytes["total"] += fwd.total_bytes_sent
        self.bytes["lower_bound"] += fwd.lower_bound_bytes
        return out

    def send_grads(self, name: str, grad: torch.Tensor, plan: StepPlan, v: int, step: int) -> torch.Tensor:
        """The row gradients of encoder pass v back to the ranks that encoded them."""
        boundary = self.boundaries[name]
        with self._span(f"boundary.grads[{name},m={v}]", "boundary", step):
            out = boundary.exchange_grads(grad, plan.encoder_pass(name, v).boundary)
        self.count_backward(name)
        return out

    def count_backward(self, name: str) -> None:
        last = self.boundaries[name].last_backward
        self.bytes["sent"] += last.bytes_sent
        self.bytes["backward"] += last.bytes_sent
        # all ranks together, from the plan: what every rank that runs the exchange knows alike
        self.bytes["backward_lower_bound"] += last.lower_bound_bytes

    # ------------------------------------------------------------------ encoders
    def encoder_forward(self, stage: Stage, samples: Sequence[dict[str, Any]], plan: StepPlan, v: int,
                        step: int | None = None) -> torch.Tensor:
        """The rows of the items this rank's dp rank of `stage` encodes in pass v (source order)."""
        port = self.ports[stage.name]
        mine = [port.select(samples[p], ks) for p, ks in plan.encoder_items(stage.name, v, stage.coord.dp)]
        with self._span(f"{stage.name}.forward[m={v}]", "forward", step):
            inputs = {k: t.to(self.stages.device) for k, t in port.inputs(mine).items()}
            return stage(**inputs)

    def encoder_backward(self, stage: Stage, rows: torch.Tensor, grad: torch.Tensor, plan: StepPlan, v: int,
                         step: int) -> None:
        with self._span(f"{stage.name}.backward[m={v}]", "backward", step):
            stage.backward((rows * grad.to(rows.dtype)).sum() * plan.encoder_scale(stage.name))

    # ------------------------------------------------------------------ language
    def language_batch(self, mine: Sequence[dict[str, Any]], rows: Sequence[Sequence[dict[str, Any]]] | None = None
                       ) -> tuple[dict[str, Any], tuple[int, ...], bool]:
        """The language stage's inputs on the device: (batch, placeholders of each encoder, sharded).

        `rows`: packed rows of these samples (models/packing.py), or None for one padded row
        per sample. With sequence shards (cp, or sp) the batch is this rank's shard and its
        labels are already shifted (context_parallel.sequence).
        """
        layout = self.stages.language.layout
        sharded = is_sharded(layout)
        if rows is None:
            host = self.adapter.language_inputs(mine, multiple=num_shards(layout))
        else:
            host = packed_language_inputs(self.adapter, rows, multiple=num_shards(layout))
        # counted on the host, so the stage's placeholder check needs no device read
        ids = shard_input_ids(host["input_ids"], layout, self.stages.rank) if sharded else host["input_ids"]
        counts = tuple(int(port.mask(ids).sum()) for port in self.ports.values())
        if not self.per_sample:  # the segments are for the per-sample attention alone
            host.pop("packed_segments", None)
        batch = {k: (t.to(self.stages.device) if isinstance(t, torch.Tensor) else t) for k, t in host.items()}
        if sharded:  # this rank's sequence shard (the [b, 1, S, S] mask is built on the device)
            batch = shard_language_batch(batch, layout, self.stages.rank)
        return batch, counts, sharded

    def language_micro_batch(self, samples: Sequence[dict[str, Any]], plan: StepPlan, dp: int, m: int
                             ) -> tuple[dict[str, Any], tuple[int, ...], bool]:
        """`language_batch` of language dp rank `dp`'s micro-batch m: its padded samples, or its
        packed rows (every pipeline stage of a dp replica builds the same one, so the shapes
        between them follow from the plan: pipeline_parallel/hidden_shape.py)."""
        mine = [samples[p] for p in plan.language_samples(dp, m)]
        rows = [[samples[p] for p in row] for row in plan.language_rows(dp, m)] if plan.packed else None
        return self.language_batch(mine, rows)

    def language_loss_sum(self, samples: Sequence[dict[str, Any]], plan: StepPlan, m: int,
                          rows_in: Sequence[torch.Tensor], step: int | None = None,
                          n_labels: int | None = None) -> torch.Tensor:
        """This rank's sum of token losses of micro-batch m (fp32, on the device).

        A mixture-of-experts language stage adds its share of the router's load-balancing loss
        (expert_parallel/aux_loss.py), scaled so that the engine's division by the global label
        count leaves `router_aux_loss_coef * aux_m / micro_batches`: the reported loss and the
        gradient are then the lm loss plus the mean over micro-batches of each one's aux loss."""
        language = self.stages.language
        batch, counts, sharded = self.language_micro_batch(samples, plan, language.coord.dp, m)
        # rows_in follow the config's stage order; the language stage takes them in its ports' order
        by_stage = dict(zip((s.name for s in self.stages.encoders), rows_in, strict=True))
        rows_in = tuple(by_stage[name] for name in self.ports)
        with self._span(f"language.forward[m={m}]", "forward", step):
            # a frozen language stage still carries the gradient of a trained encoder's rows
            logits = language(batch["input_ids"], tuple(rows_in), batch["attention_mask"], batch["position_ids"],
                              n_placeholders=counts, grad=language.trains or any(r.requires_grad for r in rows_in),
                              **segments_of(batch))
            local = token_loss_sum(logits, batch["labels"], self.lm_head, shifted=sharded)
            aux = take_aux_loss(language.module, *self.aux_group())
            if aux is not None and n_labels is not None:
                local = self.add_aux(local, aux, plan, n_labels)
            if self.loss_observer is not None:  # e.g. a client's token accuracy from this very pass
                self.loss_observer(logits.detach(), batch["labels"], sharded)
            return local

    def add_aux(self, local: torch.Tensor, aux: torch.Tensor, plan: StepPlan, n_labels: int) -> torch.Tensor:
        """`local` plus this rank's aux-loss share of a micro-batch, scaled so that the engine's
        division by the global label count leaves `router_aux_loss_coef * aux_m / micro_batches`;
        the shares, averaged over micro-batches, are StepResult.aux_loss after the engine's all-reduce."""
        self.aux_sum = self.aux_sum + aux.detach().double() / plan.micro_batches
        return local + self.adapter.router_aux_coef * aux * (n_labels / plan.micro_batches)

    def aux_group(self):
        """(the groups over which a MoE stage's aux loss counts a micro-batch's tokens, their ranks,
        the tp group whose shares are summed or None):
        the stage's dp x cp ranks (of this pipeline stage), and under sequence parallelism its tp
        ranks too (they hold other tokens then; the counts are whole numbers, summed exactly in
        either order). Each rank's share is then its own tokens'; under sequence parallelism the tp
        ranks' shares are summed on every tp rank (`expert_parallel.apply.share_over_tp`)."""
        language = self.stages.language
        layout = language.layout
        if layout.sequence_parallel:
            return (language.groups.dp_cp, language.groups.tp), layout.dp * layout.cp * layout.tp, language.groups.tp
        return (language.groups.dp_cp,), layout.dp * layout.cp, None

    def language_step(self, samples: Sequence[dict[str, Any]], plan: StepPlan, m: int,
                      rows_in: Sequence[torch.Tensor], n_labels: int, step: int
                      ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Forward and backward of the language stage on micro-batch m.

        `rows_in`: one leaf per encoder (requires_grad). Returns (the local loss sum as a float64
        tensor on the device: the schedule accumulates it and the engine reads it once per step,
        not once per micro-batch; the gradient of each encoder's rows).
        """
        local = self.language_loss_sum(samples, plan, m, rows_in, step, n_labels)
        with self._span(f"language.backward[m={m}]", "backward", step):
            self.stages.language.backward(local / n_labels * plan.language_scale())
        grads = [r.grad if r.grad is not None else torch.zeros_like(r) for r in rows_in]
        return local.detach().double(), grads

    def micro_step(self, stage: Stage, index: int) -> None:
        """DeepSpeed counts micro-steps in `step()` and updates only at the last one; the last
        pass's step is the engine's clipped step, taken after the global norm is known."""
        if index < stage.passes - 1:
            stage.micro_step()
