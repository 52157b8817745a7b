"""Run under `deepspeed --num_gpus 4` by tests/clients/test_entry_points.py: the main job and the HF Trainer
recipe on the same config, seed and data, in one set of processes (a launch costs tens of seconds).

    deepspeed --num_gpus 4 tests/helpers/entry_points_driver.py OUT_DIR

For each placement: recipes/train_llava.py for 4 steps; recipes/hf_trainer_llava.py for 2 steps
with a checkpoint (disaggregated: from OUT_DIR/model, a meta model + weights=), then again with resume_from_checkpoint=True for one epoch, i.e. to step 4 (evaluating at step 4,
save_total_limit 1, save_model at the end). Colocated only: warmup + cosine with the stage
optimizers' learning rates recorded at every step, and every construction-time conflict.
Each rank writes what it saw to OUT_DIR/rank<r>.json.
"""

import json
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.helpers.driver_report import fresh_accelerate_state, load_recipe, run_driver, write_report  # noqa: E402






def _error_of(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test asserts the type and message
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def lr_schedule_run(out, config):
    """HeteroTrainer with warmup + cosine; the stage optimizers' lr at every step's start."""
    import ds_hetero
    from transformers import TrainerCallback, TrainingArguments

    from ds_hetero.toy import ShapesCaptionDataset
    from ds_hetero.toy import tiny_llava

    seen = []

    class StageLr(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            engines = trainer.hetero_engine.engines.values()
            seen.append(sorted({g["lr"] for e in engines for g in e.optimizer.param_groups}))

    args = TrainingArguments(
        output_dir=f"{out}/lr", max_steps=5, per_device_train_batch_size=4, learning_rate=2e-3, adam_beta2=0.99,
        weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="cosine", warmup_steps=2, logging_steps=1,
        save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0, deepspeed=config)
    model = tiny_llava("clip", seed=0)
    data = ShapesCaptionDataset.for_llava(model.config, size=64, seed=0)
    trainer = ds_hetero.HeteroTrainer(model=model, args=args, train_dataset=data, callbacks=[StageLr(),
                                                                                          ds_hetero.HeteroCallback()])
    trainer.train()
    logged = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"logged": logged, "stage_optimizers": seen, "losses": losses}


def conflicts(out, config_path):
    """Every conflict must raise at construction (the stock Trainer: at train()), on every rank."""
    import ds_hetero
    from transformers import Trainer, TrainingArguments

    from ds_hetero.toy import ShapesCaptionDataset
    from ds_hetero.toy import tiny_llava

    with open(config_path) as f:
        base = json.load(f)
    model = tiny_llava("clip", seed=0)
    data = ShapesCaptionDataset.for_llava(model.config, size=32, seed=0)
    ok = dict(per_device_train_batch_size=4, learning_rate=2e-3, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0)
    cases = {
        "lr": ({}, {"learning_rate": 1e-3}),
        "batch": ({}, {"per_device_train_batch_size": 2}),
        "clipping": ({}, {"max_grad_norm": 0.5}),
        "scheduler": ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}, {}),
        "accumulation": ({}, {"gradient_accumulation_steps": 2}),
    }
    errors = {}
    for name, (ds_extra, hf_extra) in cases.items():
        fresh_accelerate_state()

        def build():
            args = TrainingArguments(output_dir=f"{out}/conflict", report_to="none", use_cpu=True, max_steps=1,
                                     deepspeed={**base, **ds_extra}, **{**ok, **hf_extra})
            ds_hetero.HeteroTrainer(model=model, args=args, train_dataset=data)
        errors[name] = _error_of(build)

    fresh_accelerate_state()
    args = TrainingArguments(output_dir=f"{out}/conflict", report_to="none", use_cpu=True, max_steps=1,
                             deepspeed=config_path, **ok)
    errors["callback_on_stock_trainer"] = _error_of(
        lambda: Trainer(model=model, args=args, train_dataset=data, callbacks=[ds_hetero.HeteroCallback()]))
    fresh_accelerate_state()
    args = TrainingArguments(output_dir=f"{out}/conflict", report_to="none", use_cpu=True, max_steps=1,
                             deepspeed=config_path, **ok)
    stock = Trainer(model=model, args=args, train_dataset=data)
    errors["stock_trainer_train"] = _error_of(stock.train)
    return errors


def main(out):
    train_llava, hf_trainer_llava = load_recipe(ROOT, "train_llava"), load_recipe(ROOT, "hf_trainer_llava")
    common = ["--samples", "64"]
    report = {}
    try:
        for placement in ("colocated", "disaggregated"):
            config = os.path.join(ROOT, "ds_configs", f"llava_{placement}.json")
            d = os.path.join(out, placement)
            os.makedirs(d, exist_ok=True)
            train_llava.main(["--steps", "4", "--deepspeed_config", config, "--summary-json", f"{d}/main.json",
                              *common])
            trainer_args = ["--deepspeed", config, "--output_dir", f"{d}/hf", "--save_strategy", "steps",
                            "--save_steps", "2", *common]
            fresh_accelerate_state()
            # disaggregated: the first run loads the seed-0 model the test saved (meta model + weights=)
            weights = ["--model", os.path.join(out, "model")] if placement == "disaggregated" else []
            hf_trainer_llava.main([*trainer_args, "--max_steps", "2", *weights,
                                   "--summary_json", f"{d}/trainer_first.json"])
            fresh_accelerate_state()
            # one epoch of 64 samples = 4 steps of 16: epochs, not max_steps, end this run
            hf_trainer_llava.main([*trainer_args, "--max_steps", "-1", "--num_train_epochs", "1",
                                   "--resume_from_checkpoint", "true",
                                   "--save_total_limit", "1", "--eval_strategy", "steps", "--eval_steps", "2",
                                   "--eval_samples", "8", "--save_final", f"{d}/final",
                                   "--summary_json", f"{d}/trainer_resumed.json"])
            report[f"{placement}_checkpoints"] = sorted(os.listdir(f"{d}/hf"))
        colocated = os.path.join(ROOT, "ds_configs", "llava_colocated.json")
        fresh_accelerate_state()
        report["lr"] = lr_schedule_run(out, colocated)
        report["conflicts"] = conflicts(out, colocated)
    except Exception:
        report["crash"] = traceback.format_exc()
    return write_report(out, report)


if __name__ == "__main__":
    run_driver(main)
