"""Run under `deepspeed --num_gpus 4` by tests/clients/test_sft_data_workers.py: the main job's recipe on real
data, five runs in one launch (the folder OUT holds the test's data; each rank reports to OUT/rank<R>.json).

    counted    4 steps, no workers, recording every row this rank encodes (SFTDataset.__getitem__) and the
               dataset indices at the positions its plan names (PlannedReader.positions_of)
    saved      2 steps, --data-workers 2 (worker processes of the rank: the real launcher's ranks may have
               them), --save OUT/ckpt
    resumed    --load OUT/ckpt, 2 more steps, --data-workers 2
    late_bad   --data-workers 2 on OUT/late_bad.json, whose row 5 has an image broken past its header
    main_llava / trainer   tiny LLaVA on shapes_messages.jsonl, 2 steps: the main job, then the HF Trainer recipe
               (recipes/hf_trainer_llava.py --data, --dataloader_num_workers 2) on the same config
    clips / clips_workers  tiny Qwen2-VL on the shipped clips (shapes_videos.jsonl), 2 steps, without and with
               --data-workers 2 (the clips decoded in the worker processes)
"""

import json
import os
import traceback

from tests.helpers.driver_report import fresh_accelerate_state, load_recipe, run_driver, write_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "recipes", "data", "shapes_llava.json")
MESSAGES = os.path.join(ROOT, "recipes", "data", "shapes_messages.jsonl")
CLIPS = os.path.join(ROOT, "recipes", "data", "shapes_videos.jsonl")
CONFIG = os.path.join(ROOT, "ds_configs", "llava_colocated.json")


def counting(run):
    """`run()` with this rank's encoded rows and planned rows recorded: (its result, reads, planned)."""
    from ds_hetero.data.planned_reader import PlannedReader
    from ds_hetero.sft_data import SFTDataset

    reads, planned = [], []
    getitem, positions_of = SFTDataset.__getitem__, PlannedReader.positions_of

    def counted_getitem(self, index):
        reads.append(int(index))
        return getitem(self, index)

    def counted_positions(self, step):
        got = positions_of(self, step)
        planned.append(sorted(self.loader.indices(step)[p] for p in got))
        return got

    SFTDataset.__getitem__, PlannedReader.positions_of = counted_getitem, counted_positions
    try:
        return run(), sorted(reads), planned
    finally:
        SFTDataset.__getitem__, PlannedReader.positions_of = getitem, positions_of


def _main_llava(recipe, out):
    summary = os.path.join(out, f"main_llava.rank{os.environ['RANK']}.json")
    recipe.main(["--data", MESSAGES, "--steps", "2", "--deepspeed_config", CONFIG, "--summary-json", summary])
    return json.load(open(summary))["losses"] if os.environ["RANK"] == "0" else None


def _trainer(out):
    """The Trainer recipe on the same rows: its logged losses and data waits (rank 0)."""
    summary = os.path.join(out, "trainer.json")
    load_recipe(ROOT, "hf_trainer_llava").main([
        "--deepspeed", CONFIG, "--output_dir", os.path.join(out, "hf"), "--save_strategy", "no",
        "--data", MESSAGES, "--max_steps", "2", "--dataloader_num_workers", "2", "--summary_json", summary])
    if os.environ["RANK"] != "0":
        return None
    steps = [h for h in json.load(open(summary))["log_history"] if "loss" in h]
    return {"losses": [h["loss"] for h in steps], "data_wait": [h.get("hetero/data_wait_s") for h in steps]}


def main(out):
    recipe = load_recipe(ROOT, "train_llava")

    def run(name, *argv):
        summary = os.path.join(out, f"{name}.rank{os.environ['RANK']}.json")
        recipe.main(["--model-family", "qwen2-vl", "--deepspeed_config", CONFIG, "--summary-json", summary, *argv])
        return json.load(open(summary))["losses"] if os.environ["RANK"] == "0" else None

    report = {}
    try:
        losses, reads, planned = counting(lambda: run("counted", "--data", DATA, "--steps", "4"))
        report["counted"] = {"losses": losses, "reads": reads, "planned": planned}
        ckpt = os.path.join(out, "ckpt")
        report["saved"] = run("saved", "--data", DATA, "--steps", "2", "--data-workers", "2", "--save", ckpt)
        report["resumed"] = run("resumed", "--data", DATA, "--steps", "2", "--data-workers", "2", "--load", ckpt)
        try:
            run("late_bad", "--data", os.path.join(out, "late_bad.json"), "--steps", "3", "--data-workers", "2")
            report["late_bad"] = None
        except Exception as exc:  # noqa: BLE001 -- the error itself is what the test checks
            report["late_bad"] = f"{type(exc).__name__}: {exc}"
        report["clips"] = run("clips", "--data", CLIPS, "--steps", "2")
        report["clips_workers"] = run("clips_workers", "--data", CLIPS, "--steps", "2", "--data-workers", "2")
        report["main_llava"] = _main_llava(recipe, out)
        fresh_accelerate_state()
        report["trainer"] = _trainer(out)
    except Exception:
        report["crash"] = traceback.format_exc()
    return write_report(out, report)


if __name__ == "__main__":
    run_driver(main)
