"""recipes/check_gpu.sh picks the right checks for the GPUs it finds, and the one-device check
runs (here on the CPU, world size 1): what can be tested of the GPU script without a GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(gpus):
    return subprocess.run(["bash", str(ROOT / "recipes/check_gpu.sh"), "--dry-run", "--gpus", str(gpus)],
                          capture_output=True, text=True, cwd=ROOT)


def test_dry_run_lists_the_checks_for_each_device_count():
    one = _dry_run(1)
    assert one.returncode == 0, one.stderr
    assert "check_one_device.py" in one.stdout and "train_llava.py" in one.stdout
    # one device: only the one-process per-sample attention test (CUDA parametrised), no multi-process suite
    assert [line for line in one.stdout.splitlines() if "pytest" in line] == [
        "+ .venv/bin/python -m pytest -q tests/step/test_per_sample_attention.py"]
    assert "test_per_sample_attention.py" in _dry_run(2).stdout
    two = _dry_run(2)
    assert two.returncode == 0, two.stderr
    assert "tests/engine/test_skipped_step.py" in two.stdout and "test_engine_parity" not in two.stdout
    assert "bench_boundary.py --backend nccl --max-world 2" in two.stdout
    four = _dry_run(4)
    assert "tests/engine/test_engine_parity.py" in four.stdout and "--max-world 4" in four.stdout
    assert "not dies_mid_step and not dead_peer" in four.stdout  # gloo's death bounds are not NCCL's
    none = _dry_run(0)
    assert none.returncode == 1 and "no GPU" in none.stderr


@pytest.mark.distributed
def test_the_one_device_check_passes_on_the_cpu(tmp_path):
    out = tmp_path / "figures.json"
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT), MASTER_PORT="0")
    proc = subprocess.run([sys.executable, str(ROOT / "recipes/check_one_device.py"), "--steps", "2",
                           "--json", str(out)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "one-device check: passed" in proc.stdout
    figures = json.loads(out.read_text())
    assert figures["weights_compared"] > 0 and len(figures["fp32_losses"]) == 2
    assert set(figures["bf16_stage_time_s"]) >= {"vision", "language"}
