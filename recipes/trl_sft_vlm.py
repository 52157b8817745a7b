"""TRL's vision-language SFT example (trl/examples/scripts/sft_vlm.py), made heterogeneous with one line.

    .venv/bin/deepspeed --num_gpus 4 recipes/trl_sft_vlm.py --deepspeed ds_configs/trainer_colocated.json --model llava
    .venv/bin/deepspeed --num_gpus 4 recipes/trl_sft_vlm.py --deepspeed ds_configs/trainer_colocated.json \
        --model qwen2_vl
    # a mixture of experts (Qwen3-VL-MoE), its experts over language ep 2; TRL's aux loss on
    .venv/bin/deepspeed --num_gpus 4 recipes/trl_sft_vlm.py --deepspeed ds_configs/trainer_colocated_moe_ep.json \
        --model qwen3_vl_moe
    # DeepSpeed settings inline (no hetero_parallel in the DeepSpeed config): the section from a file
    DS_HETERO_PARALLEL=hetero.yaml .venv/bin/deepspeed --num_gpus 4 recipes/trl_sft_vlm.py \
        --deepspeed ds_configs/trainer_zero1.json

`--lora` trains PEFT LoRA adapters (TRL's --use_peft; save_model writes the adapter).
`--stock` runs the same script with TRL's own SFTTrainer (give it a DeepSpeed config without
hetero_parallel, e.g. ds_configs/trainer_zero1.json): tests/clients/test_trl_recipe.py checks that both
give the same losses and token accuracy. As in TRL's example: a `datasets.Dataset` of `messages` +
PIL `images`, the model's processor (here the tiny models' processors, built locally: no
download), TRL's collator doing the chat template and the image processing on the fly. Every
SFTConfig / TrainingArguments flag works. Rank 0 writes the log history to --summary_json.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", category=FutureWarning)

from transformers import HfArgumentParser  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import ds_hetero  # noqa: E402
from ds_hetero.toy.messages import messages_dataset  # noqa: E402
from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe  # noqa: E402
from ds_hetero.toy import tiny_llava, tiny_qwen2_vl  # noqa: E402
from ds_hetero.toy.processors import tiny_processor  # noqa: E402


@dataclass
class ScriptArguments:
    model: str = field(default="llava", metadata={"help": "tiny model family: llava, qwen2_vl or qwen3_vl_moe"})
    samples: int = field(default=256, metadata={"help": "rows of the messages + images dataset"})
    model_seed: int = field(default=0, metadata={"help": "seed of the model's random weights"})
    stock: bool = field(default=False, metadata={"help": "TRL's SFTTrainer as is (a DeepSpeed config without "
                                                         "hetero_parallel)"})
    summary_json: str = field(default=None, metadata={"help": "rank 0 writes the log history here"})
    lora: bool = field(default=False, metadata={"help": "train LoRA adapters (PEFT, target_modules all-linear) "
                                                        "in place of the full model, as TRL's --use_peft"})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank"})


# Qwen2-VL has dynamic resolution: images of different sizes give different image-token counts
IMAGE_SIZES = {"llava": ((40, 40),), "qwen2_vl": ((16, 16), (32, 16), (24, 40), (32, 32))}
IMAGE_SIZES["qwen3_vl_moe"] = IMAGE_SIZES["qwen2_vl"]
MODELS = {"llava": lambda seed: tiny_llava("clip", seed=seed), "qwen2_vl": lambda seed: tiny_qwen2_vl(seed=seed),
          # 8 experts, top-2, output_router_logits on: TRL turns on its aux loss (router_aux_loss_coef 0.05)
          "qwen3_vl_moe": lambda seed: tiny_qwen3_vl_moe(seed=seed)}


def main(argv: list[str] | None = None) -> int:
    parser = HfArgumentParser((ScriptArguments, SFTConfig))
    # TRL's defaults that a tiny fp32 CPU run does not want; any flag still overrides them
    parser.set_defaults(output_dir="out/trl_sft_vlm", bf16=False, gradient_checkpointing=False, max_length=None,
                        per_device_train_batch_size=4, learning_rate=2e-3, logging_steps=1, report_to="none",
                        save_strategy="no")
    script, training_args = parser.parse_args_into_dataclasses(args=argv)
    if script.model not in IMAGE_SIZES:
        raise SystemExit(f"--model must be one of {sorted(IMAGE_SIZES)}, got {script.model!r}")
    model = MODELS[script.model](script.model_seed)
    processor = tiny_processor(model)
    train_dataset = messages_dataset(script.samples, seed=training_args.seed, image_sizes=IMAGE_SIZES[script.model])

    peft_config = None
    if script.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=script.lora_r, lora_alpha=2 * script.lora_r, lora_dropout=0.0,
                                 target_modules="all-linear")

    trainer_cls = SFTTrainer if script.stock else ds_hetero.hetero(SFTTrainer)  # the one line
    trainer = trainer_cls(model=model, args=training_args, train_dataset=train_dataset, processing_class=processor,
                          peft_config=peft_config)
    trainer.train()
    trainer.save_model(training_args.output_dir)  # with --lora: the PEFT adapter
    if script.summary_json and trainer.args.process_index == 0:
        with open(script.summary_json, "w") as f:
            json.dump({"log_history": trainer.state.log_history}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main([a for a in sys.argv[1:] if not a.startswith("--local_rank")]))
