"""Entry points besides `ds_hetero.initialize`: the Hugging Face Trainer and Accelerate.

    hf_trainer.py    HeteroTrainer, hetero(cls) / HeteroTrainerMixin (any Trainer subclass), HeteroCallback (a guard)
    trainer_mixin.py what the heterogeneous Trainer overrides; trainer_parts.py the engine's stand-ins there
    trainer_loss.py  loss options refused by name, a subclass's optimizer rebuilt per stage
    rank_batch.py    the Trainer's data path: each rank collates only its stages' rows
    token_metrics.py token accuracy / entropy from the engine's loss pass (TRL's metrics)
    inline.py        DS_HETERO_PARALLEL: the section for DeepSpeed settings given inline (YAML, dict)
    accelerate.py    prepare(accelerator, model, ...) -> HeteroEngine
    ds_config.py     a Trainer's or Accelerate's DeepSpeed config -> ds_hetero's, and the conflicts
    metrics.py       per-stage step metrics reduced over ranks, for Trainer logs and trackers
    guard.py         plain `deepspeed.initialize` refuses a config with `hetero_parallel`
"""
