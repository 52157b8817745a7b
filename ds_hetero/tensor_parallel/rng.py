"""The model-parallel RNG of one stage: dropout masks that tp peers agree on (Megatron's tracker, per stage).

Under tensor parallelism an activation is either replicated over the tp group (a column-parallel
layer's input) or sharded over it (a row-parallel layer's input). A dropout on a replicated
activation must drop the same entries on every tp rank, or the ranks compute different halves
of different functions; a dropout on a sharded one may draw each shard's mask independently.
torch's default generator serves neither: clients seed it per rank (ms-swift: seed + rank) or
identically on every rank (the HF Trainer), so it cannot promise "equal over tp, different over
dp". Megatron keeps a second, model-parallel RNG state for this (`CudaRNGStatesTracker`, entered
with `get_cuda_rng_tracker().fork()`); DeepSpeed's copy of it (`deepspeed.checkpointing`) is
configured once per process from one mpu, which cannot serve two stages with different tp groups
in one process (colocated placement). Hence one `StageRNG` per stage, held by its Stage and by
the dropout modules that draw from it, never a module-level global.

Streams, each a `torch.Generator` on the device of the tensor it serves (CPU here, CUDA on GPU):

    replicated   seeded from (seed, stage, step, cp, dp, pp): equal on the tp peers, different
                 over cp (other positions), dp (other samples) and pp (other layers)
    sharded      the same plus the tp rank: each shard its own mask

Re-seeded at every optimizer step from (seed, step) (`start_step`), so a run resumed from a
checkpoint draws the masks the uninterrupted run draws, with no RNG state to save. Within a
step the tp peers draw in the same order (they run the same micro-batches through the same
layers, which their collectives already require). Activation recompute restores the streams for
the recomputed forward (`checkpoint_contexts`, models/recompute.py), as torch does for its
default generator with `preserve_rng_state`.
"""

from __future__ import annotations

import contextlib
import hashlib

import torch


def stream_seed(*parts) -> int:
    """A 63-bit seed from `parts` (ints and strings), the same in every process (unlike `hash`)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class StageRNG:
    """Dropout streams of one stage on one rank (see the module docstring).

    seed    the same on every rank (the engine's `seed`); stage: the stage's name;
    coord   this rank's coordinate in the stage (tp, cp, dp, pp)
    """

    def __init__(self, seed: int, stage: str, coord):
        self.seed, self.stage = int(seed), stage
        self.tp, self.cp, self.dp, self.pp = coord.tp, coord.cp, coord.dp, coord.pp
        self.step = 0
        self._generators: dict[tuple[str, bool], torch.Generator] = {}
        self._seeded: dict[tuple[str, bool], int] = {}  # the step each generator was last seeded for

    def start_step(self, step: int) -> None:
        """Every stream restarts from (seed, step) at its next draw."""
        self.step = int(step)

    def seed_of(self, sharded: bool) -> int:
        tp = self.tp if sharded else -1  # the replicated stream ignores the tp rank
        return stream_seed(self.seed, self.stage, self.step, self.cp, self.dp, self.pp, tp)

    def generator(self, device: torch.device, sharded: bool) -> torch.Generator:
        """The stream for an activation on `device`: `sharded` over tp, or replicated."""
        key = (str(device), bool(sharded))
        gen = self._generators.get(key)
        if gen is None:
            gen = self._generators[key] = torch.Generator(device=device)
        if self._seeded.get(key) != self.step:
            gen.manual_seed(self.seed_of(sharded))  # host-side: no device sync
            self._seeded[key] = self.step
        return gen

    # ------------------------------------------------------------------ activation recompute
    def snapshot(self) -> dict:
        return {key: (gen.get_state(), self._seeded.get(key)) for key, gen in self._generators.items()}

    def restore(self, snapshot: dict) -> None:
        for key in list(self._generators):
            if key in snapshot:
                state, seeded = snapshot[key]
                self._generators[key].set_state(state)
                self._seeded[key] = seeded
            else:  # first drawn after the snapshot: it re-seeds, as it did then
                self._seeded.pop(key, None)

    def checkpoint_contexts(self):
        """(forward, recompute) context managers for `torch.utils.checkpoint(context_fn=...)`: the
        recompute draws the masks the forward drew, and the streams then continue where they were."""
        saved: dict = {}

        @contextlib.contextmanager
        def forward():
            saved.update(self.snapshot())
            yield

        @contextlib.contextmanager
        def recompute():
            now = self.snapshot()
            self.restore(saved)
            try:
                yield
            finally:
                self.restore(now)

        return forward(), recompute()
