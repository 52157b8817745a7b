"""Colocated schedule: every rank runs every stage; one micro-batch at a time.

Per micro-batch m:
    vision forward on this rank's vision share -> boundary exchange -> language forward on this
    rank's language share -> language backward -> vision backward (through the boundary).

The language stage consumes a detached copy of the exchanged rows and the vision engine then
back-propagates the surrogate `sum(rows_out * grad)`: each engine's backward enters only through
its own `engine.backward()`, which DeepSpeed's ZeRO stage 0 requires, and every rank calls the
collectives (tp, boundary, ZeRO reductions) in the same order.

Scaling: DeepSpeed divides a backward's loss by gradient_accumulation_steps and averages
gradients over the stage's dp group. To end with the gradient of
    L = (sum of token losses of the global batch) / (global label tokens)
the language loss handed to DeepSpeed is `local_sum / N * dp_language * gas`, and the vision
surrogate is scaled by `dp_vision * gas / dp_language` (the row gradients arriving from the
language stage carry its dp factor).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Sequence

import torch

from ..batching import micro_batch_samples, stage_samples
from ..boundary import BoundaryInputs
from ..loss import token_loss_sum
from ..mpu import stage_context


def _sync(device: torch.device) -> None:
    # Timers measure work, not kernel launches: wait for the device (no-op on CPU).
    if device.type != "cpu":
        from deepspeed.accelerator import get_accelerator

        get_accelerator().synchronize()


class ColocatedSchedule:
    def __init__(self, hetero):
        self.h = hetero  # the HeteroEngine: config, adapter, engines, mpus, boundary, coords

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

    def run(self, samples: Sequence[dict[str, Any]], n_labels: int) -> tuple[float, dict, dict]:
        """All micro-batches of one step up to (not including) the optimizer step.

        Returns (this rank's sum of token losses, stage times, boundary byte counts).
        """
        h = self.h
        cfg, adapter = h.config, h.adapter
        v_eng, l_eng = h.engines["vision"], h.engines["language"]
        v_mpu, l_mpu = h.mpus["vision"], h.mpus["language"]
        v_dp, l_dp, gas = cfg.stages["vision"].dp, cfg.stages["language"].dp, cfg.micro_batches
        head = h.lm_head
        times: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        bytes_ = {"sent": 0, "total": 0, "lower_bound": 0}
        loss_sum = 0.0
        device = next(l_eng.module.parameters()).device

        for m in range(gas):
            inputs = self.boundary_inputs(samples, m)
            v_samples = [samples[p] for p in stage_samples(cfg, "vision", h.coords["vision"].dp, m)]
            l_samples = [samples[p] for p in stage_samples(cfg, "language", h.coords["language"].dp, m)]

            t0 = time.perf_counter()
            with stage_context(v_mpu):
                v_in = {k: v.to(device) for k, v in adapter.vision_inputs(v_samples).items()}
                rows = v_eng(**v_in)
            _sync(device)
            t1 = time.perf_counter()
            rows_out = h.boundary.exchange(rows, inputs)
            fwd = h.boundary.last_forward
            bytes_["sent"] += fwd.bytes_sent
            bytes_["total"] += fwd.total_bytes_sent
            bytes_["lower_bound"] += fwd.lower_bound_bytes
            t2 = time.perf_counter()

            rows_in = rows_out.detach().requires_grad_(True)
            batch = {k: (v.to(device) if v is not None else None) for k, v in adapter.language_inputs(l_samples).items()}
            with stage_context(l_mpu):
                logits = l_eng(batch["input_ids"], rows_in, batch["attention_mask"], batch["position_ids"])
                local = token_loss_sum(logits, batch["labels"], head)
                _sync(device)
                t3 = time.perf_counter()
                l_eng.backward(local / n_labels * (l_dp * gas))
                _sync(device)
                t4 = time.perf_counter()
            loss_sum += float(local.detach())

            grad = rows_in.grad if rows_in.grad is not None else torch.zeros_like(rows_in)
            with stage_context(v_mpu):
                v_eng.backward((rows_out * grad).sum() * (v_dp * gas / l_dp))
            _sync(device)
            t5 = time.perf_counter()
            bytes_["sent"] += h.boundary.last_backward.bytes_sent

            if m < gas - 1:  # DeepSpeed counts micro-steps in step(); it only updates at the boundary
                for name, eng in h.engines.items():
                    with stage_context(h.mpus[name]):
                        eng.step()

            times["vision"]["forward"] += t1 - t0
            times["boundary"]["forward"] += t2 - t1
            times["language"]["forward"] += t3 - t2
            times["language"]["backward"] += t4 - t3
            times["vision"]["backward"] += t5 - t4
        return loss_sum, {k: dict(v) for k, v in times.items()}, bytes_
