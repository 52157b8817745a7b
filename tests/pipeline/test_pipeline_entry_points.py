"""The HF Trainer and Accelerate entry points with a pipelined language stage (language tp2 pp2,
vision dp4: ds_configs/llava_pipeline.json), under their real launchers, checkpoints included.

Launches (tests/helpers/pipeline_entry_driver.py; each costs tens of seconds on the 2-core box):
    deepspeed --num_gpus 4 ... trainer     main job 4 steps; Trainer 2 steps + checkpoint-2 (save_strategy
                                           "steps"), then resume_from_checkpoint to step 4, eval, save_model
    accelerate launch recipes/accelerate_llava.py (twice)   2 steps + save_state; load_state and on to step 4

Same config, seed and data everywhere: fp32 losses and grad norms equal within 1e-6 relative to the
main job's (whose pipeline training is checked against the single-process reference in
tests/pipeline/test_pipeline_engine.py). A resume that lost the checkpoint would restart from the initial
weights: its step-3 loss would differ (checked against the main job's).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.driver_report import free_port

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
REL = 1e-6
DRIVER = "tests/helpers/pipeline_entry_driver.py"




def _run(cmd, timeout=900):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _ranks(proc, out, mode):
    ranks = []
    for r in range(4):
        path = out / f"{mode}_rank{r}.json"
        assert path.exists(), proc.stdout[-3000:] + proc.stderr[-6000:]
        ranks.append(json.loads(path.read_text()))
    assert not any("crash" in r for r in ranks), [r.get("crash") for r in ranks]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return ranks


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline_entry_points")
    trainer = _run([f"{BIN}/deepspeed", "--num_gpus", "4", "--master_port", free_port(), DRIVER, "trainer", str(out)])
    yaml = out / "pipeline.yaml"
    yaml.write_text(open(os.path.join(ROOT, "ds_configs/accelerate_disaggregated.yaml")).read()
                    .replace("ds_configs/llava_disaggregated.json", os.path.join(ROOT, "ds_configs/llava_pipeline.json")))
    state = out / "acc_state"
    acc = {}
    for name, args in (("first", ["--steps", "2", "--save-state-every", "2", "--state-dir", str(state)]),
                       ("resumed", ["--steps", "4", "--resume-from", str(state / "step2")])):
        proc = _run([f"{BIN}/accelerate", "launch", "--config_file", str(yaml), "--main_process_port", free_port(),
                     "recipes/accelerate_llava.py", "--samples", "64", *args,
                     "--summary-json", str(out / f"acc_{name}.json")])
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        if name == "first":
            acc["state_2"] = sorted(os.path.relpath(os.path.join(d, f), state / "step2")
                                    for d, _, files in os.walk(state / "step2") for f in files)
    return {"out": out, "trainer": _ranks(trainer, out, "trainer"), "accelerate": acc}


def _json(runs, name):
    return json.loads((runs["out"] / f"{name}.json").read_text())


def _steps(history):
    return {h["step"]: h for h in history if "loss" in h}


def _chunk_files(listing):
    """The pipeline chunks' DeepSpeed files in a checkpoint listing."""
    return sorted(p for p in listing if "/language/pp_0" in "/" + p)


def test_trainer_checkpoints_and_resumes_with_a_pipeline(runs):
    main = _json(runs, "main")
    assert len(main["losses"]) == 4
    first = _steps(_json(runs, "trainer_first")["log_history"])
    resumed_history = _json(runs, "trainer_resumed")["log_history"]
    resumed = _steps(resumed_history)
    assert sorted(first) == [1, 2] and sorted(resumed) == [1, 2, 3, 4]
    trainer = [first[1], first[2], resumed[3], resumed[4]]
    assert [h["loss"] for h in trainer] == pytest.approx(main["losses"], rel=REL)
    assert [h["grad_norm"] for h in trainer] == pytest.approx(main["grad_norms"], rel=REL)
    # negative control: the step-3 loss depends on the restored state (step 1's loss is another number)
    assert abs(main["losses"][2] - main["losses"][0]) > 1e-3 * main["losses"][0]
    evals = [h for h in resumed_history if "eval_loss" in h]
    assert len(evals) == 1 and evals[0]["step"] == 4
    # checkpoint-2 holds each pipeline chunk's own DeepSpeed files, with its params.json
    for r in runs["trainer"]:
        files = _chunk_files(r["checkpoint_2"])
        for k in ("00", "01"):
            assert f"global_step2/global_step2/language/pp_{k}/params.json" in files, files
            assert f"global_step2/global_step2/language/pp_{k}/global_step2/mp_rank_00_model_states.pt" in files, files
            assert f"global_step2/global_step2/language/pp_{k}/global_step2/mp_rank_01_model_states.pt" in files, files
        assert r["checkpoints"] == ["checkpoint-2", "checkpoint-4"], r["checkpoints"]
    assert (runs["out"] / "final" / "config.json").exists()


def test_accelerate_saves_and_loads_state_with_a_pipeline(runs):
    main = _json(runs, "main")
    first, resumed = _json(runs, "acc_first")["losses"], _json(runs, "acc_resumed")["losses"]
    assert sorted(first, key=int) == ["0", "1"] and sorted(resumed, key=int) == ["2", "3"]  # resumed at step 3
    losses = {**first, **resumed}
    assert [losses[str(k)] for k in range(4)] == pytest.approx(main["losses"], rel=REL)
    files = _chunk_files(runs["accelerate"]["state_2"])
    for k in ("00", "01"):
        assert f"global_step2/language/pp_{k}/params.json" in files, files
        assert f"global_step2/language/pp_{k}/global_step2/mp_rank_01_model_states.pt" in files, files
