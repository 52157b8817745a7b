"""Run under `deepspeed --num_gpus 4` by tests/clients/test_swift.py: ms-swift's own `sft_main` on a local tiny LLaVA.

    deepspeed --num_gpus 4 tests/helpers/swift_driver.py DATA_DIR OUT_DIR [extra swift flags]

DATA_DIR holds `model/` (tiny LLaVA + its processor) and `data.jsonl` (messages + image paths), written by
the test. The stock run adds nothing; the heterogeneous run adds `--external_plugins recipes/swift_plugin.py`
with DS_HETERO_PARALLEL naming the section. ms-swift writes OUT_DIR/logging.jsonl on rank 0.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

# The flags a CPU run of ms-swift needs (docs/clients.md): fp32 (ms-swift turns fp16 on by default), no
# dataloader workers or dataset processes, no hub (local model and dataset; `--check_model false`: no query of the ModelScope hub for a
# newer revision), no eval split, no checkpoints, no gradient checkpointing.
CPU_FLAGS = ["--model_type", "llava1_5_hf", "--torch_dtype", "float32", "--use_hf", "true",
             "--dataloader_num_workers", "0", "--dataset_num_proc", "1", "--load_from_cache_file", "false",
             "--split_dataset_ratio", "0", "--save_strategy", "no", "--report_to", "none",
             "--gradient_checkpointing", "false", "--check_model", "false", "--fp16", "false", "--bf16", "false"]


def main():
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher's; ms-swift reads LOCAL_RANK
    data, out, extra = argv[0], argv[1], argv[2:]
    import ds_hetero  # noqa: F401 - in the stock run too: its CPU comm patch (patches.py) skips DeepSpeed's shm op build
    from swift import sft_main

    sft_main(["--model", f"{data}/model", "--dataset", f"{data}/data.jsonl", "--output_dir", out,
              "--add_version", "false", "--tuner_type", "full", "--deepspeed", "zero1",
              "--per_device_train_batch_size", "4", "--max_steps", "2", "--logging_steps", "1",
              "--learning_rate", "1e-3", "--lr_scheduler_type", "constant", "--warmup_ratio", "0",
              *CPU_FLAGS, *extra])


if __name__ == "__main__":
    main()
