"""Run by tests/pipeline/test_pipeline_entry_points.py: the main job and the HF Trainer with a pipelined
language stage (ds_configs/llava_pipeline.json: vision dp4, language tp2 pp2), under `deepspeed`.

    deepspeed --num_gpus 4 tests/helpers/pipeline_entry_driver.py trainer OUT_DIR
        recipes/train_llava.py for 4 steps (the reference losses); recipes/hf_trainer_llava.py for
        2 steps with save_strategy "steps" (checkpoint-2), then again with resume_from_checkpoint
        for one epoch (to step 4), evaluating and saving at step 4, save_model at the end

One set of processes (a launch costs tens of seconds on the 2-core box); each rank writes what it
saw to OUT_DIR/trainer_rank<r>.json. (Accelerate runs one Accelerator per process: the test
launches recipes/accelerate_llava.py itself, once to save_state and once to load_state.)
"""

import json
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.helpers.driver_report import fresh_accelerate_state, load_recipe  # noqa: E402
CONFIG = os.path.join(ROOT, "ds_configs", "llava_pipeline.json")
COMMON = ["--samples", "64"]






def _listing(path):
    """Every file under `path`, relative to it."""
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, files in os.walk(path) for f in files)


def trainer(out):
    train_llava, hf_trainer_llava = load_recipe(ROOT, "train_llava"), load_recipe(ROOT, "hf_trainer_llava")
    train_llava.main(["--steps", "4", "--deepspeed_config", CONFIG, "--summary-json", f"{out}/main.json", *COMMON])
    args = ["--deepspeed", CONFIG, "--output_dir", f"{out}/hf", "--save_strategy", "steps", "--save_steps", "2",
            *COMMON]
    fresh_accelerate_state()
    hf_trainer_llava.main([*args, "--max_steps", "2", "--summary_json", f"{out}/trainer_first.json"])
    report = {"checkpoint_2": _listing(f"{out}/hf/checkpoint-2")}
    fresh_accelerate_state()
    # one epoch of 64 samples = 4 steps of 16: epochs, not max_steps, end this run
    hf_trainer_llava.main([*args, "--max_steps", "-1", "--num_train_epochs", "1", "--resume_from_checkpoint", "true",
                           "--eval_strategy", "steps", "--eval_steps", "2", "--eval_samples", "8",
                           "--save_final", f"{out}/final", "--summary_json", f"{out}/trainer_resumed.json"])
    report["checkpoints"] = sorted(os.listdir(f"{out}/hf"))
    return report


def main(mode, out):
    try:
        report = {"trainer": trainer}[mode](out)
    except Exception:
        report = {"crash": traceback.format_exc()}
    with open(os.path.join(out, f"{mode}_rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(report, f)
    return 1 if "crash" in report else 0


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    sys.exit(main(argv[0], argv[1]))
