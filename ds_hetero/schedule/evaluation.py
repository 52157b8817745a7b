"""Forward-only evaluation: the global-batch loss of a list of samples, no gradients, both placements.

    loss = (sum of token losses of all samples) / (label tokens of all samples)

which is what the single-process Hugging Face model returns as `model(**batch).loss` for the
same samples padded into one batch. The samples are cut into micro-batches of the training
micro-batch size (`train_batch_size / micro_batches`), so every stage gives each of its dp
ranks the same share it would in training and the boundary plan is the training one. A last
partial micro-batch is filled with copies of the first sample whose labels are all ignored:
they add no loss and no label token, and keep every dp rank busy (ZeRO-3 gathers parameters
in forward over the dp group; a rank that skipped its forward would leave its peers waiting).

Micro-batches run one after the other in both placements (no pipelining: evaluation has no
backward to overlap); every rank of the boundary group calls the same exchanges in the same
order, a rank passing empty rows for a stage it does not hold.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..loss import IGNORE_INDEX, label_token_count
from ..step.step_plan import StepPlan
from .stage_work import StageWork


def _loss_free_copy(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "labels": torch.full_like(sample["labels"], IGNORE_INDEX)}


class EvaluationSchedule(StageWork):
    def padded(self, samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        size = self._micro_batch_size()
        samples = list(samples)
        missing = -len(samples) % size
        return samples + [_loss_free_copy(samples[0]) for _ in range(missing)]

    def _micro_batch_size(self) -> int:
        cfg = self.stages.config
        return cfg.global_batch_size // cfg.micro_batches

    def run(self, samples: Sequence[dict[str, Any]]) -> float:
        """The loss of `samples`, in eval mode (dropout off, as `model.eval()` would), then back to train."""
        if not samples:
            raise ValueError("eval_batch: no samples")
        for i, sample in enumerate(samples):  # every rank holds every sample: all raise alike, before any collective
            try:
                self.adapter.check_sample(sample, i)
            except ValueError as exc:
                raise ValueError(f"eval_batch: {exc}") from None
        modules = self.stages.modules()
        modes = [m.training for m in modules]
        for m in modules:
            m.eval()
        try:
            return self._loss(samples)
        finally:
            for m, mode in zip(modules, modes):
                m.train(mode)

    @torch.no_grad()
    def _loss(self, samples: Sequence[dict[str, Any]]) -> float:
        samples = self.padded(samples)
        n_labels = sum(label_token_count(s["labels"]) for s in samples)  # every rank holds every sample
        if n_labels == 0:
            raise ValueError("eval_batch: the samples have no label tokens (all labels are -100)")
        # No backward to accumulate: every encoder encodes each language micro-batch's items
        # (assigned as in training, by position or by cost), and one exchange per encoder feeds it.
        plan = StepPlan(self.stages.config, self.ports, samples, len(samples) // self._micro_batch_size(),
                        per_micro_batch=True, language_cost=self.adapter.language_cost,
                        dense_attention=self.adapter.dense_rows(self.stages.config.packed_attention))
        language = self.stages.language
        # summed on the device, read once with the all-reduce below (no device sync per micro-batch)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.stages.device)
        for m in range(plan.micro_batches):
            rows_in = []
            for stage in self.stages.encoders:
                if stage.name not in self.boundaries:  # this rank holds neither side of the pair (or,
                    continue  # with a pipeline, is a later pipeline stage: not in this exchange)
                rows = self.encoder_forward(stage, samples, plan, m) if stage.held else self.empty_rows()
                rows_in.append(self.send_rows(stage.name, rows, plan, m, step=None))
            if language.held:
                loss_sum += self._micro_batch_loss_sum(samples, plan, m, rows_in, n_labels)
        total = (loss_sum if self._holds_loss_share() else torch.zeros_like(loss_sum)).reshape(1)
        dist.all_reduce(total, group=self.stages.boundary_group)
        return total.item() / n_labels

    def _micro_batch_loss_sum(self, samples, plan: StepPlan, m: int, rows_in, n_labels: int | None = None
                              ) -> torch.Tensor:
        """This rank's share of micro-batch m's token-loss sum (float64; with a MoE language stage,
        its aux-loss share: stage_work.language_loss_sum)."""
        return self.language_loss_sum(samples, plan, m, rows_in, n_labels=n_labels).double()

    def _holds_loss_share(self) -> bool:
        """tp rank 0 of every cp shard of every language dp replica holds its share of the sum."""
        language = self.stages.language
        return language.held and language.coord.tp == 0
