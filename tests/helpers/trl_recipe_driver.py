"""Run under `deepspeed --num_gpus 4` by tests/clients/test_trl_recipe.py: recipes/trl_sft_vlm.py with TRL's stock
SFTTrainer + a plain DeepSpeed JSON, then with `ds_hetero.hetero(SFTTrainer)` + the same JSON with
hetero_parallel (vision dp4, language tp2 dp2), and with `language_batching` "packed" (the engine packs
what TRL's collator padded), for the tiny LLaVA and Qwen2-VL, in one launch;
then LLaVA with LoRA (PEFT, all-linear) both ways, the tiny Qwen3-VL-MoE at language ep2 with TRL's aux
loss (its stock run is one process: trl_moe_stock_driver.py), and the LLaVA one in ds_hetero's seeded data order
(the negative control).

    deepspeed --num_gpus 4 tests/helpers/trl_recipe_driver.py OUT_DIR
"""

import importlib.util
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.helpers.driver_report import run_driver, write_report  # noqa: E402
# adam_epsilon 1e-4 (both runs): with 1e-8 Adam turns fp32 reduction-order noise in near-zero gradients
# (CLIP's k_proj) into update differences of ~1e-4 of a step, see tests/engine_parity.py
COMMON = ["--max_steps", "3", "--samples", "64", "--adam_beta2", "0.99", "--adam_epsilon", "1e-4",
          "--weight_decay", "0",
          "--lr_scheduler_type", "constant", "--train_sampling_strategy", "sequential", "--use_cpu"]
MOE_BATCH = 16  # the global batch of the MoE runs: 4 per rank here, all of it in the stock single process


def main(out):
    spec = importlib.util.spec_from_file_location("trl_sft_vlm", os.path.join(ROOT, "recipes", "trl_sft_vlm.py"))
    recipe = importlib.util.module_from_spec(spec)
    sys.modules["trl_sft_vlm"] = recipe  # dataclasses look their module up there
    spec.loader.exec_module(recipe)
    from accelerate.state import AcceleratorState

    report = {}
    try:
        for model in ("llava", "qwen2_vl"):
            for kind, config in (("stock", "trainer_zero1.json"), ("hetero", "trainer_colocated.json"),
                                 ("packed", "trainer_colocated_packed.json")):
                AcceleratorState._reset_state(reset_partial_state=False)  # one Trainer per script, several here
                name = f"{model}_{kind}"
                recipe.main(["--model", model, "--deepspeed", os.path.join(ROOT, "ds_configs", config),
                             "--output_dir", os.path.join(out, name), "--summary_json",
                             os.path.join(out, f"{name}.json"), *COMMON, *(["--stock"] if kind == "stock" else [])])
                report[name] = "done"
        for kind, config in (("stock", "trainer_zero1.json"), ("hetero", "trainer_colocated.json")):
            AcceleratorState._reset_state(reset_partial_state=False)
            name = f"llava_{kind}_lora"
            recipe.main(["--model", "llava", "--lora", "--deepspeed", os.path.join(ROOT, "ds_configs", config),
                         "--output_dir", os.path.join(out, name), "--summary_json", os.path.join(out, f"{name}.json"),
                         *COMMON, *(["--stock"] if kind == "stock" else [])])
            report[name] = "done"
        # a mixture of experts at language ep2 with TRL's aux loss (its stock run: trl_moe_stock_driver.py)
        AcceleratorState._reset_state(reset_partial_state=False)
        recipe.main(["--model", "qwen3_vl_moe", "--deepspeed", os.path.join(ROOT, "ds_configs",
                     "trainer_colocated_moe_ep.json"), "--output_dir", os.path.join(out, "qwen3_vl_moe_hetero"),
                     "--summary_json", os.path.join(out, "qwen3_vl_moe_hetero.json"),
                     "--per_device_train_batch_size", str(MOE_BATCH // 4), *COMMON])
        report["qwen3_vl_moe_hetero"] = "done"
        # negative control: stock TRL on these 4 ranks takes each rank's aux loss on its own tokens
        AcceleratorState._reset_state(reset_partial_state=False)
        recipe.main(["--model", "qwen3_vl_moe", "--stock", "--deepspeed", os.path.join(ROOT, "ds_configs",
                     "trainer_zero1.json"), "--output_dir", os.path.join(out, "qwen3_vl_moe_stock4"),
                     "--summary_json", os.path.join(out, "qwen3_vl_moe_stock4.json"),
                     "--per_device_train_batch_size", str(MOE_BATCH // 4), *COMMON])
        # negative control: ds_hetero's seeded order in place of the sequential one (other batches)
        AcceleratorState._reset_state(reset_partial_state=False)
        args = [a for a in COMMON if a not in ("--train_sampling_strategy", "sequential")]
        recipe.main(["--model", "llava", "--deepspeed", os.path.join(ROOT, "ds_configs", "trainer_colocated.json"),
                     "--output_dir", os.path.join(out, "llava_random"), "--summary_json",
                     os.path.join(out, "llava_random.json"), *args])
    except Exception:
        report["crash"] = traceback.format_exc()
    return write_report(out, report)


if __name__ == "__main__":
    run_driver(main)
