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

from ..loss import IGNORE_INDEX, label_token_count, token_loss_sum
from ..step.shares import stage_samples
from ..topology.mpu import stage_context
from .stage_work import StageWork


def _loss_free_copy(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "labels": torch.full_like(sample["labels"], IGNORE_INDEX)}


class EvaluationSchedule(StageWork):
    def __init__(self, hetero):
        super().__init__(hetero)
        # No backward to accumulate: the vision stage encodes each language micro-batch's images
        # (assigned as in training, by position or by cost), and one exchange feeds it.
        self.v_gas = self.gas

    def padded(self, samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        size = self.h.config.global_batch_size // self.gas
        samples = list(samples)
        missing = -len(samples) % size
        return samples + [_loss_free_copy(samples[0]) for _ in range(missing)]

    def run(self, samples: Sequence[dict[str, Any]]) -> float:
        """The loss of `samples`, in eval mode (dropout off, as `model.eval()` would), then back to train."""
        if not samples:
            raise ValueError("eval_batch: no samples")
        for i, sample in enumerate(samples):  # every rank holds every sample: all raise alike, before any collective
            try:
                self.h.adapter.check_sample(sample, i)
            except ValueError as exc:
                raise ValueError(f"eval_batch: {exc}") from None
        modules = [engine.module for engine in self.h.engines.values()]
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
        h = self.h
        samples = self.padded(samples)
        n_labels = sum(label_token_count(s["labels"]) for s in samples)  # every rank holds every sample
        if n_labels == 0:
            raise ValueError("eval_batch: the samples have no label tokens (all labels are -100)")
        size = h.config.global_batch_size // self.gas
        # summed on the device, read once with the all-reduce below (no device sync per micro-batch)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for m in range(len(samples) // size):
            inputs = self.boundary_inputs(samples, m)
            rows = self._vision_rows(samples, m) if "vision" in h.engines else self.empty_rows()
            rows_in = h.boundary.exchange_rows(rows, inputs)
            if "language" in h.engines:
                loss_sum += self._language_loss_sum(samples, m, rows_in)
        # tp rank 0 of every cp shard of every language dp replica holds its share of the sum.
        lang = h.coords.get("language")
        total = (loss_sum if lang is not None and lang.tp == 0 else torch.zeros_like(loss_sum)).reshape(1)
        dist.all_reduce(total, group=h.groups.boundary)
        return total.item() / n_labels

    def _vision_rows(self, samples, m: int) -> torch.Tensor:
        h = self.h
        images = self.assignment(samples, m).images_of(h.coords["vision"].dp)
        mine = [h.adapter.select_images(samples[p], ks) for p, ks in images]
        with stage_context(h.mpus["vision"]):
            inputs = {k: v.to(self.device) for k, v in h.adapter.vision_inputs(mine).items()}
            return h.engines["vision"](**inputs)

    def _language_loss_sum(self, samples, m: int, rows_in: torch.Tensor) -> torch.Tensor:
        h = self.h
        mine = [samples[p] for p in stage_samples(h.config, "language", h.coords["language"].dp, m)]
        batch, n_image_tokens, sharded = self.language_batch(mine)
        with stage_context(h.mpus["language"]):
            logits = h.engines["language"](batch["input_ids"], rows_in, batch["attention_mask"],
                                           batch["position_ids"], n_image_tokens=n_image_tokens)
            return token_loss_sum(logits, batch["labels"], h.lm_head, shifted=sharded).double()
