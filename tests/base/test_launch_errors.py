"""A launched script's config error is printed whole by rank 0 and in one line by the others; one real launch
of recipes/train_llava.py with a Trainer-style config shows it once, with no traceback, and one of the HF Trainer
recipe with a conflicting batch; the Accelerate recipe's, run as a script in this process, the same way."""

from __future__ import annotations

import io
import logging
import os
import runpy
import subprocess
import sys

import pytest

from ds_hetero import launch_errors
from ds_hetero.errors import HeteroConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ERROR = HeteroConfigError("train_batch_size", "15 is not divisible by stage 'language' dp x micro_batches = 4")


def test_rank_zero_prints_the_whole_error(monkeypatch):
    monkeypatch.setattr(launch_errors, "OTHER_RANKS_WAIT_S", 0.0)
    out = io.StringIO()
    assert launch_errors.report_config_error(ERROR, rank=0, stream=out) == 1
    assert out.getvalue() == f"error: {ERROR}\n"


def test_other_ranks_print_one_line(monkeypatch):
    monkeypatch.setattr(launch_errors, "OTHER_RANKS_WAIT_S", 0.0)
    out = io.StringIO()
    assert launch_errors.report_config_error(ERROR, rank=3, stream=out) == 1
    assert out.getvalue() == "rank 3: stopped by the config error rank 0 prints\n"


def test_exit_code_of_passes_other_exceptions_and_codes(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    assert launch_errors.exit_code_of(lambda: 0) == 0

    def broken():
        raise RuntimeError("not a config error")

    with pytest.raises(RuntimeError):
        launch_errors.exit_code_of(broken)


def _failed_two_rank_launch(port, *argv):
    """`deepspeed --num_gpus 2 ARGV` on CPU: its stdout and stderr together, after asserting it failed."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    proc = subprocess.run([launcher, "--master_port", port, "--num_gpus", "2", *argv],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=580)
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


def test_recipe_prints_a_trainer_config_error_once():
    """Two ranks under the DeepSpeed launcher: one error text, one line from rank 1, no traceback."""
    out = _failed_two_rank_launch("29731", "recipes/train_llava.py", "--deepspeed_config",
                                  "ds_configs/trainer_colocated_packed.json", "--steps", "1", "--samples", "32")
    assert out.count('"auto" is a Trainer-only value') == 1, out[-4000:]
    assert "rank 1: stopped by the config error rank 0 prints" in out
    assert "Traceback" not in out and "ds_configs/llava_*.json" in out


def test_trainer_recipe_prints_a_config_error_once():
    """Two ranks under the DeepSpeed launcher, the main job's config: its train_batch_size 16 conflicts with
    TrainingArguments' 4 per rank x 2 ranks. One error text, one line from rank 1, no traceback; the first
    line (before the heavy imports) once."""
    out = _failed_two_rank_launch("29733", "recipes/hf_trainer_llava.py", "--deepspeed",
                                  "ds_configs/llava_colocated.json", "--max_steps", "1", "--samples", "32")
    assert out.count("error: hetero_parallel config error at 'TrainingArguments.deepspeed': the DeepSpeed config "
                     "conflicts with TrainingArguments") == 1, out[-4000:]
    assert "train_batch_size" in out and "rank 1: stopped by the config error rank 0 prints" in out
    assert "Traceback" not in out
    assert out.count("ds_hetero: hf_trainer_llava.py starting on 2 rank(s)") == 1


@pytest.mark.parametrize("rank", ["0", "1"])
def test_accelerate_recipe_prints_a_config_error_once(monkeypatch, capsys, rank):
    """recipes/accelerate_llava.py run as `accelerate launch` runs it, with a YAML that sets clipping beside the JSON
    (ds_hetero.accelerate refuses that on import, inside the recipe's main): rank 0 the whole error, rank 1 one line,
    exit code 1, no traceback."""
    monkeypatch.setattr(launch_errors, "OTHER_RANKS_WAIT_S", 0.0)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["recipes/accelerate_llava.py"])
    deepspeed_logger = logging.getLogger("DeepSpeed")
    monkeypatch.setattr(deepspeed_logger, "filters", list(deepspeed_logger.filters))  # the script adds its filter
    for name, value in {"RANK": rank, "WORLD_SIZE": "2", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "ds_configs/llava_colocated.json",
                        "ACCELERATE_CONFIG_DS_FIELDS": "gradient_clipping", "ACCELERATE_GRADIENT_CLIPPING": "1.0",
                        "HF_HUB_OFFLINE": "1"}.items():  # the last one the script sets: undone after the test
        monkeypatch.setenv(name, value)
    for module in ("ds_hetero.accelerate", "ds_hetero.integrations.accelerate_prepare"):
        monkeypatch.delitem(sys.modules, module, raising=False)  # its check runs on import: import it afresh
    with pytest.raises(SystemExit) as info:
        runpy.run_path("recipes/accelerate_llava.py", run_name="__main__")
    assert info.value.code == 1
    err = capsys.readouterr().err
    if rank == "0":
        assert err.startswith("error: hetero_parallel config error at 'deepspeed_config_file': the accelerate config "
                              "sets gradient_clipping=1.0 (use gradient_clipping in the JSON)"), err
        assert err.count("\n") == 1
    else:
        assert err == "rank 1: stopped by the config error rank 0 prints\n"
