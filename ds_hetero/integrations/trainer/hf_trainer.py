"""The Hugging Face Trainer, heterogeneous: `HeteroTrainer` for `transformers.Trainer`, `hetero(cls)` for any subclass.

    args = TrainingArguments(..., deepspeed="ds_configs/llava_colocated.json")
    trainer = ds_hetero.HeteroTrainer(model=model, args=args, train_dataset=data, eval_dataset=held_out)
    trainer = ds_hetero.hetero(SFTTrainer)(model=model, args=args, train_dataset=data)   # TRL, any subclass
    trainer.train()                                      # one Trainer step = one ds_hetero optimizer step
    trainer.save_model("out/final")                      # consolidated HF checkpoint

Why a Trainer subclass and not a callback: a callback never receives the Trainer, can hand back
only control flags, and by `on_train_begin` the Trainer has already built a whole-model
DeepSpeedEngine (shared/reference/hf-trainer-accelerate.md). `HeteroCallback` is therefore a
guard: in a stock Trainer it stops the run at construction, on every rank, saying what to write;
in a heterogeneous Trainer it does nothing. Without the callback, a stock Trainer given a
`hetero_parallel` config is stopped by the `deepspeed.initialize` guard (integrations/guard.py)
when `train()` builds its engine, as soon as the script has imported ds_hetero.

What the overrides do: mixin.py. Checkpoints (`save_steps`, `save_total_limit`,
`resume_from_checkpoint`) go through the Trainer's own DeepSpeed branch: `HeteroModel.save_checkpoint /
load_checkpoint` write and read ds_hetero's per-stage checkpoint in `checkpoint-N/global_stepN`.

Data: the dataset's rows go through the Trainer's `data_collator` when one is given or the subclass
builds one (TRL's), and the collated batch is split back per sample (data/samples.py); without one,
dataset items are ds_hetero samples (per-sample dicts: input_ids, labels, image fields), which the
engine pads. Each rank reads and collates only the rows its stages handle (rank_batch.py).
"""

from __future__ import annotations

from transformers import Trainer

from .callback import HeteroCallback
from .mixin import HeteroTrainerMixin, hetero
from .parts import GlobalBatchDataLoader, GlobalBatchSampler, HeteroModel, HeteroOptimizer

__all__ = ["GlobalBatchDataLoader", "GlobalBatchSampler", "HeteroCallback", "HeteroModel", "HeteroOptimizer",
           "HeteroTrainer", "HeteroTrainerMixin", "hetero"]


class HeteroTrainer(HeteroTrainerMixin, Trainer):
    """`transformers.Trainer` over a HeteroEngine: `ds_hetero.hetero(Trainer)`."""

    _ds_hetero_mixin = True
