"""Forward-only evaluation with a pipelined language stage (pp > 1).

The same loss and the same cut into micro-batches as schedule/evaluation.py; per micro-batch:
every encoder's forward and exchange (to the first pipeline stage only), then the pipeline
stages one after the other, each sending its hidden states to the next with a blocking
point-to-point send in the pp group (evaluation has no backward to overlap, so no 1F1B).
With cp or sequence parallelism each rank sends its sequence shard (pipeline_shapes.py).
The last pipeline stage's tp rank 0 of every cp shard of every dp replica holds its share of
the loss sum; one all-reduce over the boundary group gives every rank the loss. A
mixture-of-experts stage's router statistics follow the hidden states (router_carry.py), and
the last pipeline stage adds each micro-batch's aux loss as the pp-1 evaluation does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..loss import token_loss_sum
from ..step.step_plan import StepPlan
from .evaluation import EvaluationSchedule
from .router_carry import RouterCarry
from .stage_work import segments_of
from ..pipeline_parallel.hidden_shape import hidden_shape


class PipelineEvaluationSchedule(EvaluationSchedule):
    """EvaluationSchedule's loop; a micro-batch runs through the pipeline stages in turn."""

    def _holds_loss_share(self) -> bool:
        language = self.stages.language
        return language.held and language.coord.pp == language.layout.pp - 1 and language.coord.tp == 0

    def _micro_batch_loss_sum(self, samples, plan: StepPlan, m: int, rows_in, n_labels: int | None = None
                              ) -> torch.Tensor:
        language = self.stages.language
        coord, pp = language.coord, language.layout.pp
        neighbours, group = language.groups.ranks_of["pp"], language.groups.pp
        batch, counts, sharded = self.language_micro_batch(samples, plan, coord.dp, m)
        args = (batch["attention_mask"], batch["position_ids"])
        experts = self.adapter.router_experts
        carry, s = (RouterCarry(self, experts) if experts else None), {}
        if coord.pp == 0:
            out = language(batch["input_ids"], tuple(rows_in), *args, n_placeholders=counts, **segments_of(batch))
        else:
            x = torch.empty(hidden_shape(language.layout, batch, sharded, language.module.input_width),
                            dtype=self.stages.dtype, device=self.stages.device)
            dist.recv(x, neighbours[coord.pp - 1], group=group)
            if carry is not None:
                carry.recv(s, neighbours[coord.pp - 1], group)
            out = language(x, (), *args, input_ids=batch["input_ids"], **segments_of(batch))
        if carry is not None:
            carry.forward(s)
        if coord.pp < pp - 1:
            dist.send(out.contiguous(), neighbours[coord.pp + 1], group=group)
            if carry is not None:
                dist.send(s["carry"].contiguous(), neighbours[coord.pp + 1], group=group)
            return torch.zeros((), dtype=torch.float64, device=self.stages.device)
        local = token_loss_sum(out, batch["labels"], self.lm_head, shifted=sharded)
        if carry is not None and n_labels is not None:
            local = carry.add_aux(local, s, plan, n_labels)
        return local.double()
