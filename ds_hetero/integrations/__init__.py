"""Entry points besides `ds_hetero.initialize`: the Hugging Face Trainer and Accelerate.

    hf_trainer.py    HeteroTrainer (a Trainer subclass) and HeteroCallback (a guard)
    accelerate.py    prepare(accelerator, model, ...) -> HeteroEngine
    ds_config.py     a Trainer's or Accelerate's DeepSpeed config -> ds_hetero's, and the conflicts
    metrics.py       per-stage step metrics reduced over ranks, for Trainer logs and trackers
    guard.py         plain `deepspeed.initialize` refuses a config with `hetero_parallel`
"""
