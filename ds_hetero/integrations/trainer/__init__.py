"""The Hugging Face Trainer entry point.

    hf_trainer.py    HeteroTrainer, hetero(cls) / HeteroTrainerMixin (any Trainer subclass), HeteroCallback (a guard)
    mixin.py         what the heterogeneous Trainer overrides; parts.py the engine's stand-ins there
    loss.py          loss options refused by name, a subclass's optimizer rebuilt per stage
    rank_batch.py    the Trainer's data path: each rank collates only its stages' rows, token ids gathered
    indexed_batch.py the same for a dataset with a length index (SFTDataset): no gather, rows read ahead
    read_ahead.py    dataloader_num_workers / prefetch_factor (or the JSON's data_workers) for that reader
    token_metrics.py token accuracy / entropy from the engine's loss pass (TRL's metrics)
    peft_adapter.py  save_model of a PEFT model: the adapter gathered from every stage
    callback.py      HeteroCallback: a stock Trainer given a hetero_parallel config refuses to run
"""
