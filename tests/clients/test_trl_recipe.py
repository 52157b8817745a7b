"""recipes/trl_sft_vlm.py (TRL's VLM SFT example with `ds_hetero.hetero(SFTTrainer)`) under the real launcher,
4 CPU ranks: the same script with TRL's stock SFTTrainer and a plain DeepSpeed JSON gives the same fp32
losses (1e-5 relative), token accuracy, entropy and num_tokens, for the tiny LLaVA and Qwen2-VL (dynamic
resolution: images of four sizes). Both runs use Trainer-style "auto" JSONs filled from the same flags.
The same with `language_batching` "packed" (docs/packing.md). Negative control: ds_hetero's seeded data
order (other batches) gives other losses."""

import json
import os

import pytest

from tests.helpers.driver_report import launch_driver

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("trl_recipe")
    launch_driver(ROOT, "trl_recipe_driver.py", out, timeout=1200)

    def steps(name):
        return [h for h in json.loads((out / f"{name}.json").read_text())["log_history"] if "loss" in h]

    steps.out = out
    return steps


@pytest.mark.parametrize("model", ["llava", "qwen2_vl", "llava_packed", "qwen2_vl_packed"])
def test_one_line_matches_stock_sft_trainer(runs, model):
    # *_packed: `language_batching` "packed" re-packs what TRL's collator padded (TRL itself refuses
    # packing for vision datasets): the same losses, accuracy and entropy with less work
    family, packed = model.replace("_packed", ""), model.endswith("_packed")
    stock, hetero = runs(f"{family}_stock"), runs(f"{family}_{'packed' if packed else 'hetero'}")
    assert len(stock) == len(hetero) == 3
    for s, h in zip(stock, hetero):
        assert h["loss"] == pytest.approx(s["loss"], rel=REL)
        assert h["mean_token_accuracy"] == pytest.approx(s["mean_token_accuracy"], rel=REL, abs=1e-9)
        assert h["entropy"] == pytest.approx(s["entropy"], rel=REL)
        assert h["num_tokens"] == s["num_tokens"]
        assert h["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-4)
        assert "hetero/vision/forward_s" in h
    assert stock[-1]["mean_token_accuracy"] > 0 and stock[-1]["loss"] < stock[0]["loss"]  # it trains


def test_lora_matches_stock_lora_run_and_saves_a_loadable_adapter(runs):
    import torch
    from peft import PeftModel

    from ds_hetero.toy import tiny_llava

    stock, hetero = runs("llava_stock_lora"), runs("llava_hetero_lora")
    assert len(stock) == len(hetero) == 3
    for s, h in zip(stock, hetero):
        assert h["loss"] == pytest.approx(s["loss"], rel=REL)
        assert h["mean_token_accuracy"] == pytest.approx(s["mean_token_accuracy"], rel=REL, abs=1e-9)
    assert stock[-1]["loss"] != pytest.approx(runs("llava_stock")[-1]["loss"], rel=1e-3)  # LoRA != full training
    adapters = {}
    for kind in ("stock", "hetero"):
        model = PeftModel.from_pretrained(tiny_llava("clip", seed=0), str(runs.out / f"llava_{kind}_lora"))
        adapters[kind] = {n: p.detach() for n, p in model.named_parameters() if "lora_" in n}
    assert len(adapters["hetero"]) == len(adapters["stock"]) > 0
    initial_b_zero = 0
    for name, want in adapters["stock"].items():
        got = adapters["hetero"][name]
        scale = max(want.abs().max().item(), 1e-2)
        assert (got - want).abs().max().item() / scale < 1e-5, name
        initial_b_zero += int("lora_B" in name and want.abs().max().item() > 0)
    assert initial_b_zero > 0  # B starts at zero: the trained adapters moved


def test_negative_control_other_order_other_losses(runs):
    stock, other = runs("llava_stock"), runs("llava_random")
    assert abs(other[0]["loss"] - stock[0]["loss"]) > 1e-4 * stock[0]["loss"]
