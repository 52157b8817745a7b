"""The pieces of stage work both schedules are made of, for one micro-batch.

Scaling (shared by both schedules): DeepSpeed divides a backward's loss by
gradient_accumulation_steps and averages gradients over the stage's dp group. To end with the
gradient of
    L = (sum of token losses of the global batch) / (global label tokens)
the language loss handed to DeepSpeed is `local_sum / N * dp_language * gas`; the row
gradients it produces therefore carry a factor dp_language, and the vision surrogate
`sum(rows * grad)` is scaled by `dp_vision * gas / dp_language`.

Each engine's backward enters only through its own `engine.backward()` (the language stage
consumes a detached leaf; the vision stage back-propagates the surrogate), which DeepSpeed's
ZeRO stage 0 requires.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..batching import micro_batch_samples, stage_samples
from ..boundary import BoundaryInputs
from ..loss import token_loss_sum
from ..mpu import stage_context


class StageWork:
    def __init__(self, hetero):
        self.h = hetero  # the HeteroEngine: config, adapter, engines, mpus, boundary, coords, timeline
        cfg = hetero.config
        self.gas = cfg.micro_batches
        self.v_dp, self.l_dp = cfg.stages["vision"].dp, cfg.stages["language"].dp

    @property
    def device(self) -> torch.device:
        return self.h.device

    def boundary_inputs(self, samples: Sequence[dict[str, Any]], m: int) -> BoundaryInputs:
        cfg, adapter = self.h.config, self.h.adapter
        positions = micro_batch_samples(cfg, m)
        v_size, l_size = cfg.micro_batch_size("vision"), cfg.micro_batch_size("language")
        offsets = range(len(positions))
        return BoundaryInputs(
            token_counts=[adapter.image_token_count(samples[p]) for p in positions],
            src_dp=[i // v_size for i in offsets],
            dst_dp=[i // l_size for i in offsets],
        )

    def empty_rows(self, requires_grad: bool = False) -> torch.Tensor:
        """`[0, H]` in the boundary dtype: what a rank passes for a side of the exchange it is not on."""
        return torch.zeros(0, self.h.adapter.hidden_size, dtype=self.h.boundary_dtype, device=self.device,
                           requires_grad=requires_grad)

    def vision_forward(self, samples, m: int, step: int) -> torch.Tensor:
        h = self.h
        mine = [samples[p] for p in stage_samples(h.config, "vision", h.coords["vision"].dp, m)]
        with h.timeline.span(f"vision.forward[m={m}]", "forward", step), stage_context(h.mpus["vision"]):
            inputs = {k: v.to(self.device) for k, v in h.adapter.vision_inputs(mine).items()}
            rows = h.engines["vision"](**inputs)
        return rows

    def language_step(self, samples, m: int, rows_in: torch.Tensor, n_labels: int, step: int):
        """Forward and backward of the language stage.

        Returns (local loss sum, a float64 tensor on the device: the schedule accumulates it and
        the engine reads it once per step, not once per micro-batch; gradient of rows_in).
        """
        h = self.h
        mine = [samples[p] for p in stage_samples(h.config, "language", h.coords["language"].dp, m)]
        host = h.adapter.language_inputs(mine)
        # counted on the host, so the stage's placeholder check needs no device read
        n_image_tokens = int((host["input_ids"] == h.adapter.image_token_id).sum())
        batch = {k: (v.to(self.device) if v is not None else None) for k, v in host.items()}
        engine = h.engines["language"]
        with stage_context(h.mpus["language"]):
            with h.timeline.span(f"language.forward[m={m}]", "forward", step):
                logits = engine(batch["input_ids"], rows_in, batch["attention_mask"], batch["position_ids"],
                                n_image_tokens=n_image_tokens)
                local = token_loss_sum(logits, batch["labels"], h.lm_head)
            with h.timeline.span(f"language.backward[m={m}]", "backward", step):
                engine.backward(local / n_labels * (self.l_dp * self.gas))
        grad = rows_in.grad if rows_in.grad is not None else torch.zeros_like(rows_in)
        return local.detach().double(), grad

    def vision_backward(self, rows: torch.Tensor, grad: torch.Tensor, m: int, step: int) -> None:
        h = self.h
        with h.timeline.span(f"vision.backward[m={m}]", "backward", step), stage_context(h.mpus["vision"]):
            h.engines["vision"].backward((rows * grad.to(rows.dtype)).sum() * (self.v_dp * self.gas / self.l_dp))

    def micro_step(self, stage: str, m: int) -> None:
        """DeepSpeed counts micro-steps in `step()` and updates only at the last one; the last
        micro-batch's step is the engine's clipped step, taken after the global norm is known."""
        if m < self.gas - 1:
            with stage_context(self.h.mpus[stage]):
                self.h.engines[stage].step()
