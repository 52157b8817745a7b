"""Run under `deepspeed --num_gpus 1` by tests/clients/test_trl_recipe.py: recipes/trl_sft_vlm.py with TRL's stock
SFTTrainer on the tiny Qwen3-VL-MoE in ONE process, the whole global batch (16) per step, TRL's aux loss on.

Why one process: the MoE load-balancing loss is not linear in the batch, and stock TRL on several ranks takes
it per rank (each rank's own tokens), while the heterogeneous engine takes it over the global batch, as the
single process does (docs/expert-parallel.md); the 4-rank ds_hetero run (trl_recipe_driver.py) is compared
with this run.

    deepspeed --num_gpus 1 tests/helpers/trl_moe_stock_driver.py OUT_DIR
"""

import importlib.util
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.helpers.driver_report import run_driver, write_report  # noqa: E402
from tests.helpers.trl_recipe_driver import COMMON, MOE_BATCH  # noqa: E402


def main(out):
    spec = importlib.util.spec_from_file_location("trl_sft_vlm", os.path.join(ROOT, "recipes", "trl_sft_vlm.py"))
    recipe = importlib.util.module_from_spec(spec)
    sys.modules["trl_sft_vlm"] = recipe
    spec.loader.exec_module(recipe)
    report = {}
    try:
        recipe.main(["--model", "qwen3_vl_moe", "--stock", "--deepspeed", os.path.join(ROOT, "ds_configs",
                     "trainer_zero1.json"), "--output_dir", os.path.join(out, "qwen3_vl_moe_stock"),
                     "--summary_json", os.path.join(out, "qwen3_vl_moe_stock.json"),
                     "--per_device_train_batch_size", str(MOE_BATCH), *COMMON])
        report["qwen3_vl_moe_stock"] = "done"
    except Exception:
        report["crash"] = traceback.format_exc()
    return write_report(out, report)


if __name__ == "__main__":
    run_driver(main)
