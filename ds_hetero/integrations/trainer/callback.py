"""HeteroCallback: a guard that stops a stock Trainer given to ds_hetero (see hf_trainer.py for why)."""

from __future__ import annotations

from transformers import TrainerCallback

from ...errors import HeteroConfigError


class HeteroCallback(TrainerCallback):
    """A guard: in a stock Trainer it stops the run at construction (see the module doc)."""

    def on_init_end(self, args, state, control, **kwargs):
        if not getattr(self, "_in_hetero_trainer", False):
            raise HeteroConfigError(
                "callbacks", "HeteroCallback cannot make a stock Trainer heterogeneous (a callback never receives the "
                "Trainer, and the Trainer builds a whole-model DeepSpeed engine before any callback could act). Make "
                "the Trainer class heterogeneous with one line: `ds_hetero.hetero(SFTTrainer)(...)` in place of "
                "`SFTTrainer(...)` (any Trainer subclass, same arguments; `ds_hetero.HeteroTrainer(...)` for "
                "`transformers.Trainer`)")
        return control
