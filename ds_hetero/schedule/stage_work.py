"""The pieces of stage work both schedules are made of, for one micro-batch.

Scaling (shared by both schedules): DeepSpeed divides a backward's loss by
gradient_accumulation_steps and averages gradients over the stage's dp group. To end with the
gradient of
    L = (sum of token losses of the global batch) / (global label tokens)
the language loss handed to DeepSpeed is `local_sum / N * dp_language * gas`; the row
gradients it produces therefore carry a factor dp_language, and the vision surrogate
`sum(rows * grad)` is scaled by `dp_vision * gas_vision / dp_language` (gas_vision: the vision
stage's own micro-batches, `stages.vision.micro_batches`; each engine's
gradient_accumulation_steps is the number of backward calls it gets per step).

The vision stage encodes, per vision micro-batch, the images `balance.encoder_assignment` gives
its dp rank (by position or balanced by cost); the boundary inputs carry that source placement.

Each engine's backward enters only through its own `engine.backward()` (the language stage
consumes a detached leaf; the vision stage back-propagates the surrogate), which DeepSpeed's
ZeRO stage 0 requires.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from ..step.balance import EncoderAssignment, encoder_assignment
from ..step.shares import stage_samples
from ..boundary import BoundaryInputs
from ..boundary.inputs import num_shards
from ..context_parallel import image_positions, is_sharded, padded_lengths, shard_input_ids, shard_language_batch
from ..loss import token_loss_sum
from ..topology.mpu import stage_context


class StageWork:
    def __init__(self, hetero):
        self.h = hetero  # the HeteroEngine: config, adapter, engines, mpus, boundary, coords, timeline
        cfg = hetero.config
        self.gas = cfg.micro_batches
        self.v_gas = cfg.micro_batches_of("vision")  # divides gas: each vision pass feeds gas / v_gas
        self.v_dp, self.l_dp = cfg.stages["vision"].dp, cfg.stages["language"].dp

    @property
    def device(self) -> torch.device:
        return self.h.device

    def assignment(self, samples: Sequence[dict[str, Any]], v: int) -> EncoderAssignment:
        """Which vision dp rank encodes which image of vision micro-batch v (pure, every rank)."""
        return encoder_assignment(self.h.config, self.h.adapter, samples, "vision", v, self.v_gas)

    def boundary_inputs(self, samples: Sequence[dict[str, Any]], v: int) -> BoundaryInputs:
        """The boundary of vision micro-batch v: its samples, sent to the language micro-batches they
        belong to (one exchange covers gas / v_gas of them; a destination's rows come in sample order;
        with a sharded language sequence, v_gas == gas: config.py refuses anything else)."""
        cfg, adapter = self.h.config, self.h.adapter
        a = self.assignment(samples, v)
        positions = a.samples
        l_mb, l_size = cfg.global_batch_size // self.gas, cfg.micro_batch_size("language")
        v_size = cfg.global_batch_size // (self.v_gas * self.v_dp)
        inputs = BoundaryInputs(
            token_counts=a.token_counts,
            src_dp=a.src_dp([i // v_size for i in range(len(positions))]),
            dst_dp=[(p % l_mb) // l_size for p in positions],
        )
        if is_sharded(cfg.language):  # each language rank takes the rows of its sequence shard only
            mb = [samples[p] for p in positions]
            inputs = dataclasses.replace(inputs, positions=image_positions(mb, adapter.image_token_id),
                                         seq_len=padded_lengths(mb, inputs.dst_dp, cfg.language))
        return inputs

    def language_micro_batches(self, v: int) -> range:
        """The language micro-batches vision micro-batch v feeds."""
        per = self.gas // self.v_gas
        return range(v * per, (v + 1) * per)

    def language_rows(self, samples: Sequence[dict[str, Any]], m: int) -> int:
        """Boundary rows this rank's language share of micro-batch m consumes."""
        h = self.h
        return sum(h.adapter.image_token_count(samples[p])
                   for p in stage_samples(h.config, "language", h.coords["language"].dp, m))

    def empty_rows(self, requires_grad: bool = False) -> torch.Tensor:
        """`[0, H]` in the boundary dtype: what a rank passes for a side of the exchange it is not on."""
        return torch.zeros(0, self.h.adapter.hidden_size, dtype=self.h.boundary_dtype, device=self.device,
                           requires_grad=requires_grad)

    def vision_forward(self, samples, m: int, step: int) -> torch.Tensor:
        h = self.h
        images = self.assignment(samples, m).images_of(h.coords["vision"].dp)
        mine = [h.adapter.select_images(samples[p], ks) for p, ks in images]
        with h.timeline.span(f"vision.forward[m={m}]", "forward", step), stage_context(h.mpus["vision"]):
            inputs = {k: v.to(self.device) for k, v in h.adapter.vision_inputs(mine).items()}
            rows = h.engines["vision"](**inputs)
        return rows

    def language_batch(self, mine: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], int, bool]:
        """The language stage's inputs on the device: (batch, image placeholders in it, sharded).

        With sequence shards (cp, or sp) the batch is this rank's shard and its labels are
        already shifted (context_parallel.sequence).
        """
        h = self.h
        layout = h.config.language
        sharded = is_sharded(layout)
        host = h.adapter.language_inputs(mine, multiple=num_shards(layout))
        # counted on the host, so the stage's placeholder check needs no device read
        ids = shard_input_ids(host["input_ids"], layout, h.rank) if sharded else host["input_ids"]
        n_image_tokens = int((ids == h.adapter.image_token_id).sum())
        batch = {k: (v.to(self.device) if v is not None else None) for k, v in host.items()}
        if sharded:  # this rank's sequence shard (the [b, 1, S, S] mask is built on the device)
            batch = shard_language_batch(batch, layout, h.rank)
        return batch, n_image_tokens, sharded

    def language_step(self, samples, m: int, rows_in: torch.Tensor, n_labels: int, step: int):
        """Forward and backward of the language stage.

        Returns (local loss sum, a float64 tensor on the device: the schedule accumulates it and
        the engine reads it once per step, not once per micro-batch; gradient of rows_in).
        """
        h = self.h
        mine = [samples[p] for p in stage_samples(h.config, "language", h.coords["language"].dp, m)]
        batch, n_image_tokens, sharded = self.language_batch(mine)
        engine = h.engines["language"]
        with stage_context(h.mpus["language"]):
            with h.timeline.span(f"language.forward[m={m}]", "forward", step):
                logits = engine(batch["input_ids"], rows_in, batch["attention_mask"], batch["position_ids"],
                                n_image_tokens=n_image_tokens)
                local = token_loss_sum(logits, batch["labels"], h.lm_head, shifted=sharded)
                if h.loss_observer is not None:
                    h.loss_observer(logits.detach(), batch["labels"], sharded)
            with h.timeline.span(f"language.backward[m={m}]", "backward", step):
                engine.backward(local / n_labels * (self.l_dp * self.gas))
        grad = rows_in.grad if rows_in.grad is not None else torch.zeros_like(rows_in)
        return local.detach().double(), grad

    def vision_backward(self, rows: torch.Tensor, grad: torch.Tensor, m: int, step: int) -> None:
        h = self.h
        with h.timeline.span(f"vision.backward[m={m}]", "backward", step), stage_context(h.mpus["vision"]):
            h.engines["vision"].backward((rows * grad.to(rows.dtype)).sum() * (self.v_dp * self.v_gas / self.l_dp))

    def micro_step(self, stage: str, m: int) -> None:
        """DeepSpeed counts micro-steps in `step()` and updates only at the last one; the last
        micro-batch's step is the engine's clipped step, taken after the global norm is known."""
        if m < (self.v_gas if stage == "vision" else self.gas) - 1:
            with stage_context(self.h.mpus[stage]):
                self.h.engines[stage].step()
