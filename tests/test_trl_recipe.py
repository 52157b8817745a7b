"""recipes/trl_sft_vlm.py (TRL's VLM SFT example with `ds_hetero.hetero(SFTTrainer)`) under the real launcher,
4 CPU ranks: the same script with TRL's stock SFTTrainer and a plain DeepSpeed JSON gives the same fp32
losses (1e-5 relative), token accuracy, entropy and num_tokens, for the tiny LLaVA and Qwen2-VL (dynamic
resolution: images of four sizes). Both runs use Trainer-style "auto" JSONs filled from the same flags.
Negative control: ds_hetero's seeded data order (other batches) gives other losses."""

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
REL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("trl_recipe")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([f"{BIN}/deepspeed", "--num_gpus", "4", "--master_port", port, "tests/helpers/trl_recipe_driver.py",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    ranks = []
    for r in range(4):
        path = out / f"rank{r}.json"
        assert path.exists(), proc.stdout[-3000:] + proc.stderr[-6000:]
        ranks.append(json.loads(path.read_text()))
    assert not any("crash" in r for r in ranks), [r.get("crash") for r in ranks]
    assert proc.returncode == 0, proc.stderr[-6000:]

    def steps(name):
        return [h for h in json.loads((out / f"{name}.json").read_text())["log_history"] if "loss" in h]

    steps.out = out
    return steps


@pytest.mark.parametrize("model", ["llava", "qwen2_vl"])
def test_one_line_matches_stock_sft_trainer(runs, model):
    stock, hetero = runs(f"{model}_stock"), runs(f"{model}_hetero")
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
