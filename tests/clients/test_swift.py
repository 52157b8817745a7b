"""ms-swift's own SFT entry point (`sft_main`, its llava1_5_hf template and collator) with the one line
(`--external_plugins recipes/swift_plugin.py`, DS_HETERO_PARALLEL naming the section), against its stock
ZeRO-1 run: 4 CPU ranks, a local tiny LLaVA (full tuning with ms-swift's default frozen vision tower, and
ms-swift's LoRA with its per-rank seeds, at dropout 0 and at its default 0.05),
16 rows = one global batch, 2 steps (the second on the weights the first updated), AdamW, clipping active.

ms-swift 4.6 requires transformers < 5.20, peft < 0.21, trl < 1.0, datasets < 4.8.5: it is installed
in the low pinned set only (DS_HETERO_PINS=low bash .ci/setup), and this module is skipped elsewhere.

Checked: loss (1e-5 relative) and grad norm (1e-4) at both steps, ms-swift's `token_acc` (computed in
its `compute_loss`, which the engine replaces: here from the engine's loss pass) and the Trainer's
`total_flos` (every sample has the same length, so the stock count has no padding and the two are
equal). That the one line took effect: the heterogeneous run logs ds_hetero's per-stage metrics, the
stock run none. Negative control: the second step's loss differs from the first by far more than the
tolerance, so a run that skipped the update (or trained other weights) would fail the comparison.
"""

import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("swift", reason="ms-swift 4.6 needs transformers < 5.20: it runs in the low pinned set (.ci/run)")

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
SECTION = {"hetero_parallel": {"placement": "colocated", "micro_batches": 2,
                               "stages": {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}}}


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _write_inputs(data):
    import numpy as np
    from PIL import Image

    from ds_hetero.toy import tiny_llava
    from ds_hetero.toy.processors import tiny_llava_processor
    from ds_hetero.toy.shapes import COLOURS, SHAPES

    colours = sorted(COLOURS)

    model = tiny_llava(seed=0)
    model.save_pretrained(data / "model")
    tiny_llava_processor(model).save_pretrained(data / "model")
    rng = np.random.default_rng(0)
    (data / "img").mkdir()
    with open(data / "data.jsonl", "w") as f:
        for i in range(16):
            path = data / "img" / f"{i}.png"
            Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")).save(path)
            answer = f"{colours[i % len(colours)]} {SHAPES[i % len(SHAPES)]}"  # same length: no padding
            f.write(json.dumps({"messages": [{"role": "user", "content": "<image>what is here ?"},
                                             {"role": "assistant", "content": answer}],
                                "images": [str(path)]}) + "\n")
    (data / "hetero.json").write_text(json.dumps(SECTION))


def _launch(data, out, env_extra=None, extra=()):
    # caches of its own: ms-swift's dataset cache (datasets' builder locks) is per-user otherwise
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "MODELSCOPE_CACHE": str(out / "cache"), "HF_DATASETS_CACHE": str(out / "cache" / "datasets"),
           **(env_extra or {})}
    proc = subprocess.run([f"{BIN}/deepspeed", "--num_gpus", "4", "--master_port", _port(),
                           "tests/helpers/swift_driver.py", str(data), str(out), *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    log = out / "logging.jsonl"
    assert proc.returncode == 0 and log.exists(), proc.stdout[-4000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [r for r in rows if "loss" in r and "train_loss" not in r]
    final = next(r for r in rows if "train_loss" in r)
    return steps, final


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data = tmp_path_factory.mktemp("swift")
    _write_inputs(data)
    hetero_env = {"DS_HETERO_PARALLEL": str(data / "hetero.json")}
    plugin = ["--external_plugins", os.path.join(ROOT, "recipes", "swift_plugin.py")]
    return {"stock": _launch(data, data / "stock"),
            "hetero": _launch(data, data / "hetero", hetero_env, plugin)}


@pytest.fixture(scope="module")
def lora_runs(runs, tmp_path_factory):
    """ms-swift's LoRA (`--tuner_type lora`: its own targets, rank and init; every rank seeded with
    `seed + rank`, so each builds different adapters): stock and one-line at lora_dropout 0, and the
    one-line run at ms-swift's default dropout (0.05) under language tp 2."""
    data = tmp_path_factory.mktemp("swift_lora")
    _write_inputs(data)
    hetero_env = {"DS_HETERO_PARALLEL": str(data / "hetero.json")}
    plugin = ["--external_plugins", os.path.join(ROOT, "recipes", "swift_plugin.py")]
    lora = ["--tuner_type", "lora"]
    return {"stock": _launch(data, data / "stock", extra=(*lora, "--lora_dropout", "0")),
            "hetero": _launch(data, data / "hetero", hetero_env, (*plugin, *lora, "--lora_dropout", "0")),
            "dropout": _launch(data, data / "dropout", hetero_env, (*plugin, *lora))}


def test_lora_trains_rank_0s_model_as_stock_swift(lora_runs):
    """Adapters that differ per rank (ms-swift's seed + rank) train rank 0's model, as stock DeepSpeed does."""
    (stock, _), (mine, _) = lora_runs["stock"], lora_runs["hetero"]
    assert len(stock) == len(mine) == 2
    for s, m in zip(stock, mine):
        assert m["loss"] == pytest.approx(s["loss"], rel=1e-5)
        assert m["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-4)


def test_lora_with_swifts_default_dropout_trains(lora_runs):
    """ms-swift's default lora_dropout 0.05 at language tp 2: it runs, its first step equals the dropout-free
    one (LoRA's B starts at zero, so the first forward does not see the masks), and its second step stays
    within the dropout's noise of it (the masks differ from any other run's, so no exact reference exists)."""
    (plain, _), (mine, _) = lora_runs["stock"], lora_runs["dropout"]
    assert len(mine) == 2
    assert mine[0]["loss"] == pytest.approx(plain[0]["loss"], rel=1e-5)
    assert mine[1]["loss"] == pytest.approx(plain[1]["loss"], rel=2e-2)
    assert mine[1]["loss"] < mine[0]["loss"]


def test_one_line_trains_like_stock_swift(runs):
    (stock, _), (mine, _) = runs["stock"], runs["hetero"]
    assert len(stock) == len(mine) == 2
    for s, m in zip(stock, mine):
        assert m["loss"] == pytest.approx(s["loss"], rel=1e-5)
        assert m["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-4)
    assert stock[0]["grad_norm"] > 1.0  # ms-swift's max_grad_norm 1.0: clipping active


def test_token_acc_comes_through(runs):
    (stock, _), (mine, _) = runs["stock"], runs["hetero"]
    for s, m in zip(stock, mine):
        assert "token_acc" in s and "token_acc" in m
        assert m["token_acc"] == pytest.approx(s["token_acc"], abs=1e-6)


def test_total_flos_comes_through(runs):
    (_, stock), (_, mine) = runs["stock"], runs["hetero"]
    assert stock["total_flos"] > 0
    assert mine["total_flos"] == pytest.approx(stock["total_flos"], rel=1e-6)


def test_the_one_line_took_effect(runs):
    (stock, _), (mine, _) = runs["stock"], runs["hetero"]
    staged = [k for k in mine[0] if k.startswith("hetero/")]
    assert staged, sorted(mine[0])
    assert "hetero/boundary_bytes" in staged and not [k for k in stock[0] if k.startswith("hetero/")]


def test_negative_control_the_update_moves_the_loss_past_the_tolerance(runs):
    (stock, _), (mine, _) = runs["stock"], runs["hetero"]
    assert abs(stock[1]["loss"] - stock[0]["loss"]) > 100 * 1e-5 * abs(stock[0]["loss"])
    assert mine[1]["loss"] != pytest.approx(stock[0]["loss"], rel=1e-5)
