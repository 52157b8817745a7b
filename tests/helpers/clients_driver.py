"""Run under `deepspeed --num_gpus 4` by tests/clients/test_clients.py: real Trainer classes made heterogeneous
with one line, on the TRL VLM data path (messages + PIL images, TRL's collator), in one launch.

    deepspeed --num_gpus 4 tests/helpers/clients_driver.py OUT_DIR

Layout: colocated, vision dp4, language tp2 dp2, 2 micro-batches, global batch 16, fp32.
    reference  ds_hetero.initialize + train_batch on the same global batches (TRL's collator applied to
               the whole batch, split per sample, full samples on every rank), 2 steps
    sft        ds_hetero.hetero(SFTTrainer)(model, args, train_dataset=messages, processing_class=processor),
               report_to tensorboard; losses, TRL metrics, rows each rank collated
    trainer    ds_hetero.HeteroTrainer with data_collator=TRL's collator (a plain Trainer + collator)
    factory    a LLaMA-Factory-like Seq2SeqTrainer subclass (create_optimizer / create_scheduler /
               _get_train_sampler / compute_loss overridden) via hetero(cls, engine_loss=True), on
               ds_hetero samples (no collator); and its reference on the sequential batches
    errors     the options refused at construction, and a stock SFTTrainer stopped at train()
Each rank writes OUT_DIR/rank<r>.json.
"""

import json
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.helpers.driver_report import fresh_accelerate_state, run_driver, write_report  # noqa: E402

STEPS, BATCH, LR = 2, 16, 2e-3
CONFIG = {
    "train_batch_size": BATCH,
    "zero_optimization": {"stage": 1},
    "gradient_clipping": 1.0,
    "steps_per_print": 1000000,
    "hetero_parallel": {"placement": "colocated", "micro_batches": 2,
                        "stages": {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "cp": 1, "dp": 2}}},
}




def _adamw(params):
    import torch

    return torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)


def _args(cls, out, **extra):
    kw = dict(output_dir=out, max_steps=STEPS, per_device_train_batch_size=BATCH // 4, learning_rate=LR,
              adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="constant", logging_steps=1,
              save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0, deepspeed=CONFIG)
    kw.update(extra)
    return cls(**kw)


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def reference(batches, rows_of, save_after_first=None):
    """ds_hetero.initialize on explicit global batches (full samples on every rank); optionally the
    weights after step 1 saved as an HF checkpoint."""
    import ds_hetero
    from ds_hetero.toy import tiny_llava

    engine = ds_hetero.initialize(tiny_llava("clip", seed=0), CONFIG, optimizer=_adamw, seed=0)
    losses = []
    for k, b in enumerate(batches):
        losses.append(engine.train_batch(rows_of(b)).loss)
        if k == 0 and save_after_first:
            engine.save_pretrained(save_after_first)
    return losses


def hf_token_metrics(samples, weights=None):
    """Single-process HF model (initial weights, or `weights`): TRL's token accuracy and entropy on one batch."""
    import torch
    from transformers import LlavaForConditionalGeneration

    from ds_hetero.toy import tiny_llava
    from tests.helpers.collate import _collate

    model = tiny_llava("clip", seed=0) if weights is None else LlavaForConditionalGeneration.from_pretrained(weights)
    batch = _collate(samples)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[:, :-1].float()
    target = batch["labels"][:, 1:]
    mask = target != -100
    x, t = logits[mask], target[mask]
    correct = (x.gather(-1, t[:, None])[:, 0] >= x.max(-1).values).double().mean().item()
    logp = torch.log_softmax(x, -1)
    entropy = (-(logp.exp() * logp).sum(-1)).double().mean().item()
    num_tokens = int(batch["attention_mask"].sum())
    return {"mean_token_accuracy": correct, "entropy": entropy, "num_tokens": num_tokens,
            "loss": model(**batch).loss.item()}


def sft_run(out, data, processor):
    import ds_hetero
    from trl import SFTConfig, SFTTrainer

    from ds_hetero.toy import tiny_llava

    args = _args(SFTConfig, f"{out}/sft", report_to="tensorboard", bf16=False,
                 gradient_checkpointing=False, max_length=None)
    trainer = ds_hetero.hetero(SFTTrainer)(model=tiny_llava("clip", seed=0), args=args, train_dataset=data,
                                           processing_class=processor)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {"losses": _losses(trainer), "logs": logs, "rows_prepared": trainer.rows_prepared,
            "steps": trainer._hetero_rows.steps}


def trainer_run(out, data, processor, inline=False):
    """A plain Trainer given TRL's collator; `inline`: the DeepSpeed config as a dict without the section,
    which comes from the file DS_HETERO_PARALLEL names (as with DeepSpeed settings inline in a YAML)."""
    import ds_hetero
    from transformers import TrainingArguments
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from ds_hetero.toy import tiny_llava

    config = CONFIG
    if inline:
        config = {k: v for k, v in CONFIG.items() if k != "hetero_parallel"}
        path = f"{out}/hetero_parallel.json"
        if os.environ["RANK"] == "0":
            with open(path, "w") as f:
                json.dump({"hetero_parallel": CONFIG["hetero_parallel"]}, f)
        import torch.distributed as dist

        dist.barrier()
        os.environ["DS_HETERO_PARALLEL"] = path
    args = _args(TrainingArguments, f"{out}/trainer", remove_unused_columns=False, deepspeed=config,
                 max_steps=1 if inline else STEPS)
    trainer = ds_hetero.HeteroTrainer(model=tiny_llava("clip", seed=0), args=args, train_dataset=data,
                                      data_collator=DataCollatorForVisionLanguageModeling(processor))
    try:
        trainer.train()
    finally:
        os.environ.pop("DS_HETERO_PARALLEL", None)
    return {"losses": _losses(trainer), "rows_prepared": trainer.rows_prepared}


def factory_run(out):
    """LLaMA-Factory's CustomSeq2SeqTrainer shape: its own optimizer, scheduler, sampler and compute_loss."""
    import torch
    from torch.utils.data import SequentialSampler
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    import ds_hetero
    from ds_hetero.toy import ShapesCaptionDataset
    from ds_hetero.toy import tiny_llava

    calls = []

    class CustomSeq2SeqTrainer(Seq2SeqTrainer):
        def create_optimizer(self, model=None):
            if self.optimizer is None:  # a projector group with its own lr, as LLaMA-Factory's custom optimizers
                calls.append("create_optimizer")
                proj = [p for n, p in self.model.named_parameters() if "multi_modal_projector" in n]
                rest = [p for n, p in self.model.named_parameters() if "multi_modal_projector" not in n]
                self.optimizer = torch.optim.AdamW([{"params": proj, "lr": LR}, {"params": rest, "lr": LR}],
                                                   lr=LR, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
            return super().create_optimizer(model)

        def create_scheduler(self, num_training_steps, optimizer=None):
            calls.append("create_scheduler")
            return super().create_scheduler(num_training_steps, optimizer)

        def _get_train_sampler(self, train_dataset=None):
            calls.append("_get_train_sampler")
            return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    model = tiny_llava("clip", seed=0)
    data = ShapesCaptionDataset.for_llava(model.config, size=64, seed=3, text_only_every=4)
    args = _args(Seq2SeqTrainingArguments, f"{out}/factory")
    trainer = ds_hetero.hetero(CustomSeq2SeqTrainer, engine_loss=True)(model=model, args=args, train_dataset=data)
    trainer.train()
    groups = {name: len(e.optimizer.param_groups) for name, e in trainer.hetero_engine.engines.items()}
    batches = [list(range(k * BATCH, (k + 1) * BATCH)) for k in range(STEPS)]
    fresh_accelerate_state()
    ref = reference(batches, lambda b: [data[i] for i in b])
    return {"losses": _losses(trainer), "reference": ref, "calls": sorted(set(calls)), "groups": groups}


def errors_run(out, data, processor):
    from trl import SFTConfig, SFTTrainer

    import ds_hetero
    from ds_hetero.toy import tiny_llava

    found = {}

    def error_of(fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the test asserts type and message
            return {"type": type(exc).__name__, "message": str(exc)}
        return None

    for name, extra in {"dft": {"loss_type": "dft"}, "smoothing": {"label_smoothing_factor": 0.1}}.items():
        fresh_accelerate_state()
        args = _args(SFTConfig, f"{out}/err", bf16=False, gradient_checkpointing=False, max_length=None, **extra)
        found[name] = error_of(lambda: ds_hetero.hetero(SFTTrainer)(
            model=tiny_llava("clip", seed=0), args=args, train_dataset=data, processing_class=processor))
    fresh_accelerate_state()
    args = _args(SFTConfig, f"{out}/err", bf16=False, gradient_checkpointing=False, max_length=None)
    stock = SFTTrainer(model=tiny_llava("clip", seed=0), args=args, train_dataset=data, processing_class=processor)
    found["stock_sft_train"] = error_of(stock.train)
    return found


def main(out):
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from ds_hetero.data import split_collated
    from ds_hetero.data.loader import GlobalBatchLoader
    from ds_hetero.families import adapter_for
    from ds_hetero.toy import tiny_llava
    from tests.helpers.trl_data import messages_dataset, tiny_llava_processor

    report = {}
    try:
        model = tiny_llava("clip", seed=0)
        processor = tiny_llava_processor(model)
        data = messages_dataset(64, seed=0)
        collator = DataCollatorForVisionLanguageModeling(processor)
        order = GlobalBatchLoader(data, BATCH, seed=0)
        batches = [order.indices(k) for k in range(STEPS)]

        def rows_of(b):
            return split_collated(collator([data[i] for i in b]), adapter_for(model))

        report["reference"] = reference(batches, rows_of, save_after_first=f"{out}/ref_step1")
        if os.environ["RANK"] == "0":  # single-process references (rank 0 wrote the checkpoint)
            report["hf_step1"] = hf_token_metrics(rows_of(batches[0]))
            report["hf_step2"] = hf_token_metrics(rows_of(batches[1]), f"{out}/ref_step1")
        fresh_accelerate_state()
        report["sft"] = sft_run(out, data, processor)
        fresh_accelerate_state()
        report["trainer"] = trainer_run(out, data, processor)
        fresh_accelerate_state()
        report["inline"] = trainer_run(out, data, processor, inline=True)
        fresh_accelerate_state()
        report["factory"] = factory_run(out)
        report["errors"] = errors_run(out, data, processor)
    except Exception:
        report["crash"] = traceback.format_exc()
    return write_report(out, report)


if __name__ == "__main__":
    run_driver(main)
