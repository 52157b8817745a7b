"""`ds-hetero validate` on a Trainer-style "auto" DeepSpeed JSON (batch numbers as flags) and on a
DeepSpeed config whose hetero_parallel section comes from the DS_HETERO_PARALLEL file."""

import json

from ds_hetero.cli import main

SECTION = {"placement": "colocated", "micro_batches": 2,
           "stages": {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}}
AUTO = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 1, "reduce_bucket_size": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}}}


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_trainer_auto_json(tmp_path, capsys):
    path = _write(tmp_path, "auto.json", {**AUTO, "hetero_parallel": SECTION})
    assert main(["validate", path, "--world-size", "4"]) == 1
    assert "--per-device-train-batch-size" in capsys.readouterr().err
    assert main(["validate", path, "--world-size", "4", "--per-device-train-batch-size", "4",
                 "--model", "tiny-llava"]) == 0
    assert "global batch 16" in capsys.readouterr().out
    # a batch the layout cannot split: 1 x 4 ranks = 4 samples over language dp2 x 4 micro-batches
    # (an encoder may take fewer samples than its dp ranks, balance "tokens"; the language stage may not)
    four = _write(tmp_path, "four.json", {**AUTO, "hetero_parallel": {**SECTION, "micro_batches": 4}})
    assert main(["validate", four, "--world-size", "4", "--per-device-train-batch-size", "1"]) == 1
    assert "invalid" in capsys.readouterr().err
    assert main(["validate", path, "--world-size", "4", "--per-device-train-batch-size", "4",
                 "--max-grad-norm", "-1"]) == 1
    assert "gradient_clipping" in capsys.readouterr().err


def test_inline_section_validated_like_the_json(tmp_path, capsys):
    zero3 = _write(tmp_path, "zero3.json", {**AUTO, "zero_optimization": {"stage": 3}})
    section = tmp_path / "hetero.yaml"
    section.write_text("hetero_parallel:\n  placement: colocated\n  micro_batches: 2\n  stages:\n"
                       "    vision: {tp: 1, dp: 4}\n    language: {tp: 2, dp: 2}\n")
    args = ["validate", zero3, "--world-size", "4", "--per-device-train-batch-size", "4"]
    assert main(args) == 1  # no section anywhere
    capsys.readouterr()
    assert main([*args, "--hetero-parallel", str(section)]) == 0
    assert "language  tp2 cp1 dp2" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("placement: colocated\nstages:\n  vision: {tp: 3, dp: 1}\n  language: {tp: 2, dp: 2}\n")
    assert main([*args, "--hetero-parallel", str(bad)]) == 1
    assert "invalid" in capsys.readouterr().err
    both = _write(tmp_path, "both.json", {**AUTO, "hetero_parallel": SECTION})
    assert main(["validate", both, "--world-size", "4", "--per-device-train-batch-size", "4",
                 "--hetero-parallel", str(section)]) == 1
    assert "keep one" in capsys.readouterr().err
