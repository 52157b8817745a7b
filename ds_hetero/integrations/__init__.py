"""Entry points besides `ds_hetero.initialize`: the Hugging Face Trainer and Accelerate.

    trainer/             the Hugging Face Trainer: HeteroTrainer, hetero(cls), its data path, loss and metrics
    accelerate_prepare.py prepare(accelerator, model, ...) -> HeteroEngine (public as ds_hetero.accelerate)
    inline.py            DS_HETERO_PARALLEL: the section for DeepSpeed settings given inline (YAML, dict)
    ds_config.py         a Trainer's or Accelerate's DeepSpeed config -> ds_hetero's, and the conflicts
    metrics.py           per-stage step metrics reduced over ranks, for Trainer logs and trackers
    guard.py             plain `deepspeed.initialize` refuses a config with `hetero_parallel`
"""
