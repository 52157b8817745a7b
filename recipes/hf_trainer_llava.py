"""A Hugging Face Trainer script on the shapes-captioning task, made heterogeneous by ds_hetero.HeteroTrainer.

    .venv/bin/deepspeed --num_gpus 4 recipes/hf_trainer_llava.py --deepspeed ds_configs/llava_colocated.json
    .venv/bin/deepspeed --num_gpus 4 recipes/hf_trainer_llava.py --deepspeed ds_configs/llava_disaggregated.json \
        --max_steps 200 --eval_strategy steps --eval_steps 50 --save_steps 100 --output_dir out/hf

A stock Trainer script except for the line that builds `HeteroTrainer` (in place of `Trainer`).
Every TrainingArguments flag works (`--max_steps`, `--num_train_epochs`, `--lr_scheduler_type`,
`--warmup_steps`, `--save_steps`, `--resume_from_checkpoint`, `--report_to`, ...). The
defaults match the main job (recipes/train_llava.py) and ds_configs/*.json: lr 2e-3, betas
(0.9, 0.99), no weight decay, clipping 1.0, a global batch of 16 (4 per rank on 4 ranks),
constant learning rate, the same seeded model and data order, so both learn the same way.
Rank 0 prints its startup phases with their times, the layout line as the first log, one line of named
numbers per log, and writes the log history (and the eval losses) to --summary-json; a config error is
printed once, whole by rank 0 (ds_hetero/launch_errors.py).
`--data FILE` trains on conversations (sft_data's SFTDataset, e.g. recipes/data/shapes_llava.json) read as
the launcher reads them: the length index gives every sample's token ids, each rank reads only its stages'
rows, ahead of the step in `--dataloader_num_workers` processes; `hetero/data_wait_s` is logged.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import dataclass, field

if __name__ == "__main__":
    from ds_hetero.reporting.startup import first_line, hide_cpu_accelerator_message  # light: no torch

    # rank 0's first line, before the imports that take seconds on every rank; DeepSpeed's per-process
    # "Setting accelerator to CPU" left out, rank 0 says it once (device_note in main)
    first_line(__file__, "torch, transformers and DeepSpeed")
    hide_cpu_accelerator_message()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", category=FutureWarning, message=".*torch.distributed.*is deprecated")

import torch  # noqa: E402
from transformers import HfArgumentParser, TrainingArguments  # noqa: E402

import ds_hetero  # noqa: E402
from ds_hetero.toy import ShapesCaptionDataset  # noqa: E402
from ds_hetero.toy import tiny_llava  # noqa: E402


@dataclass
class ScriptArguments:
    samples: int = field(default=4096, metadata={"help": "size of the synthetic training set"})
    eval_samples: int = field(default=0, metadata={"help": "size of a held-out set (0: no eval_dataset)"})
    vision: str = field(default="clip", metadata={"help": "tower of the built-in tiny model: clip or siglip"})
    model: str = field(default=None, metadata={
        "help": "a LlavaForConditionalGeneration safetensors checkpoint directory: built on the meta device, every "
                "rank reads only its stages' tp shards (ds_hetero.meta_model + weights=)"})
    data: str = field(default=None, metadata={
        "help": "conversations (JSON list, JSONL, or a folder of JSONL shards) in place of the synthetic set"})
    image_folder: str = field(default=None, metadata={"help": "where --data's image paths are relative to"})
    summary_json: str = field(default=None, metadata={"help": "rank 0 writes the log history here"})
    save_final: str = field(default=None, metadata={"help": "trainer.save_model() here at the end"})


def parse_args(argv=None):
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    parser.set_defaults(
        output_dir="out/hf_trainer_llava", max_steps=100, per_device_train_batch_size=4, learning_rate=2e-3,
        adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="constant", logging_steps=1,
        save_strategy="no", report_to="none", seed=0, disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
    )
    return parser.parse_args_into_dataclasses(argv)


def conversations(script, model):
    """--data as an SFTDataset, encoded by the checkpoint's processor or the tiny model's (built locally)."""
    from ds_hetero.sft_data import SFTDataset
    from ds_hetero.toy.processors import processor_for

    return SFTDataset.from_file(script.data, processor_for(script.model, model), image_folder=script.image_folder)


def main(argv=None) -> int:
    script, args = parse_args(argv)  # first: --help answers without DeepSpeed's import
    from deepspeed.accelerator import get_accelerator
    from ds_hetero.reporting.startup import LAUNCHER_NOTE, PhaseClock, device_note, show_startup

    if os.environ.get("RANK", "0") == "0":  # the library logs its startup phases on every rank; rank 0 shows them
        show_startup()
        if "LOCAL_RANK" in os.environ:  # under a launcher
            print(LAUNCHER_NOTE, flush=True)
    clock = PhaseClock()
    clock.note(f"imports done; {device_note(get_accelerator().device_name())}")
    if script.model:
        model, weights = ds_hetero.meta_model(script.model, dtype=torch.float32), script.model
    else:
        model, weights = tiny_llava(script.vision, seed=args.seed), None
    train = conversations(script, model) if script.data else \
        ShapesCaptionDataset.for_llava(model.config, size=script.samples, seed=args.seed)
    held_out = (ShapesCaptionDataset.for_llava(model.config, size=script.eval_samples, seed=args.seed + 1)
                if script.eval_samples else None)
    clock.done("model and dataset built")

    trainer = ds_hetero.HeteroTrainer(model=model, args=args, train_dataset=train, eval_dataset=held_out,
                                       weights=weights)
    resume = args.resume_from_checkpoint
    trainer.train(resume_from_checkpoint=True if resume in ("true", "True", "last") else resume)
    if script.save_final:
        trainer.save_model(script.save_final)

    if trainer.is_world_process_zero():
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        print(f"steps {trainer.state.global_step}  first loss {losses[0]:.4f}  last loss {losses[-1]:.4f}"
              if losses else f"steps {trainer.state.global_step}", flush=True)
        if script.summary_json:
            with open(script.summary_json, "w") as f:
                json.dump({"log_history": trainer.state.log_history, "global_step": trainer.state.global_step}, f)
    return 0


if __name__ == "__main__":
    from ds_hetero.launch_errors import exit_code_of

    sys.exit(exit_code_of(main))  # a config error printed once, by rank 0, not a traceback per rank
