"""`ds-hetero validate`: rank map on success, the error and exit code 1 on failure."""

import json
import subprocess
import sys
from pathlib import Path

from ds_hetero.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_validate_prints_the_rank_map(capsys):
    assert main(["validate", str(ROOT / "ds_configs/llava_colocated.json"), "--world-size", "4"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "valid for 4 ranks" in out
    assert any(line.split()[:3] == ["vision", "tp1", "cp1"] for line in lines)
    rank_rows = [line.split() for line in lines if line[:1].isdigit()]
    # rank -> (vision coord, language coord): vision dp = rank; language tp fastest
    assert rank_rows == [["0", "0,0,0", "0,0,0"], ["1", "0,0,1", "1,0,0"], ["2", "0,0,2", "0,0,1"], ["3", "0,0,3", "1,0,1"]]


def test_validate_disaggregated_marks_ranks_outside_a_stage(tmp_path, capsys):
    cfg = {"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
           "hetero_parallel": {"placement": "disaggregated", "stages": {
        "vision": {"dp": 1}, "language": {"tp": 3, "dp": 1}}}}
    path = tmp_path / "d.json"
    path.write_text(json.dumps(cfg))
    assert main(["validate", str(path), "--world-size", "4"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:1].isdigit()]
    assert rows == [["0", "0,0,0", "-"], ["1", "-", "0,0,0"], ["2", "-", "1,0,0"], ["3", "-", "2,0,0"]]


def test_invalid_config_exits_1_with_the_field():
    proc = subprocess.run(
        [sys.executable, "-m", "ds_hetero.cli", "validate", str(ROOT / "ds_configs/llava_colocated.json"),
         "--world-size", "6"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 1
    assert "hetero_parallel.stages.vision" in proc.stderr and "product is 6" in proc.stderr


def test_validate_shows_encoder_balance_and_micro_batches(tmp_path, capsys):
    cfg = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "hetero_parallel": {"micro_batches": 2, "balance": "tokens", "stages": {
        "vision": {"dp": 4, "micro_batches": 1}, "language": {"tp": 2, "dp": 2}}}}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(cfg))
    assert main(["validate", str(path), "--world-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "encoder balance tokens" in out
    stages = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("vision", "language"))}
    assert stages["vision"][6:11] == ["1", "2", "(items", "by", "cost)"] and stages["language"][6:8] == ["2", "2"]
