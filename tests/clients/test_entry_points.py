"""The three entry points under their real launchers give the same training, step by step.

Launches (shared by every test here; each costs tens of seconds on the 2-core box):
    deepspeed --num_gpus 4 tests/helpers/entry_points_driver.py     main job + HF Trainer recipe, both placements,
                                                            Trainer resume / eval / save_model, lr schedule,
                                                            construction-time conflicts
    accelerate launch ... accelerate_colocated.yaml         Accelerate recipe, 4 steps (meta model + weights=)
    accelerate launch ... accelerate_disaggregated.yaml     2 steps + save_state, then load_state -> step 4
    accelerate launch ... (YAML + mixed_precision), 2 ranks  the conflict, on every rank

Same config, seed and data everywhere: fp32 losses and grad norms equal within 1e-6 relative.
Negative control: the cosine-schedule run (same data, other learning rates) differs from step 2 on.
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




def _run(cmd, timeout=600):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _accelerate(yaml, *args, procs=None):
    extra = ["--num_processes", str(procs)] if procs else []
    return _run([f"{BIN}/accelerate", "launch", "--config_file", yaml, *extra, "--main_process_port", free_port(),
                 "recipes/accelerate_llava.py", "--samples", "64", *args])


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("entry_points")
    # The recipes' built-in model (tiny LLaVA, seed 0) as a checkpoint: the colocated Accelerate run and
    # the disaggregated Trainer's first run load it on the meta device + weights= (each rank reads only
    # its shards), and must still train exactly like the runs that build the model.
    from ds_hetero.toy import tiny_llava

    tiny_llava("clip", seed=0).save_pretrained(out / "model")
    driver = _run([f"{BIN}/deepspeed", "--num_gpus", "4", "--master_port", free_port(),
                   "tests/helpers/entry_points_driver.py", str(out)], timeout=900)
    ranks = []
    for r in range(4):
        path = out / f"rank{r}.json"
        assert path.exists(), driver.stdout[-3000:] + driver.stderr[-6000:]
        ranks.append(json.loads(path.read_text()))
    assert not any("crash" in r for r in ranks), [r.get("crash") for r in ranks]
    _ok(driver)

    acc = {}
    colocated = _accelerate("ds_configs/accelerate_colocated.yaml", "--steps", "4", "--model", str(out / "model"),
                            "--log-jsonl",
                            str(out / "acc.jsonl"), "--summary-json", str(out / "acc_colocated.json"))
    _ok(colocated)
    acc["colocated"] = json.loads((out / "acc_colocated.json").read_text())
    state = str(out / "acc_state")
    first = _accelerate("ds_configs/accelerate_disaggregated.yaml", "--steps", "2", "--save-state-every", "2",
                        "--state-dir", state, "--summary-json", str(out / "acc_d1.json"))
    _ok(first)
    resumed = _accelerate("ds_configs/accelerate_disaggregated.yaml", "--steps", "4", "--resume-from",
                          f"{state}/step2", "--summary-json", str(out / "acc_d2.json"))
    _ok(resumed)
    acc["disaggregated"] = [json.loads((out / f"acc_d{i}.json").read_text()) for i in (1, 2)]
    acc["jsonl"] = [json.loads(line) for line in (out / "acc.jsonl").read_text().splitlines()]

    bad_yaml = out / "bad.yaml"
    bad_yaml.write_text(open(os.path.join(ROOT, "ds_configs/accelerate_colocated.yaml")).read()
                        + "mixed_precision: bf16\n")
    acc["conflict"] = _accelerate(str(bad_yaml), "--steps", "1", procs=2)
    return {"out": out, "ranks": ranks, "acc": acc}


def _summary(runs, placement, name):
    return json.loads((runs["out"] / placement / f"{name}.json").read_text())


def _trainer_steps(history):
    return {h["step"]: h for h in history if "loss" in h}


@pytest.mark.parametrize("placement", ["colocated", "disaggregated"])
def test_main_job_trainer_and_accelerate_train_alike(runs, placement):
    main = _summary(runs, placement, "main")
    assert len(main["losses"]) == 4
    # the boundary's backward moves its lower bound: nothing colocated (each vision rank holds its rows'
    # copies), every row gradient once disaggregated
    assert main["boundary_backward_bytes_per_step"] == main["boundary_backward_lower_bound_per_step"]
    assert (main["boundary_backward_bytes_per_step"] > 0) == (placement == "disaggregated"), main
    # HF Trainer: steps 1-2, then resumed from checkpoint-2 (resume_from_checkpoint=True) to step 4
    first = _trainer_steps(_summary(runs, placement, "trainer_first")["log_history"])
    resumed = _trainer_steps(_summary(runs, placement, "trainer_resumed")["log_history"])
    assert sorted(first) == [1, 2] and sorted(resumed) == [1, 2, 3, 4]
    trainer = [first[1], first[2], resumed[3], resumed[4]]
    assert [h["loss"] for h in trainer] == pytest.approx(main["losses"], rel=REL)
    assert [h["grad_norm"] for h in trainer] == pytest.approx(main["grad_norms"], rel=REL)
    # Accelerate: 4 steps (colocated), or 2 steps + save_state, load_state, 2 more (disaggregated)
    acc = runs["acc"][placement]
    losses = ({**acc[0]["losses"], **acc[1]["losses"]} if placement == "disaggregated" else acc["losses"])
    assert sorted(losses, key=int) == ["0", "1", "2", "3"]
    assert [losses[str(k)] for k in range(4)] == pytest.approx(main["losses"], rel=REL)
    if placement == "disaggregated":
        assert sorted(acc[1]["losses"], key=int) == ["2", "3"]  # resumed at step 3, not from scratch
    # negative control: other learning rates on the same data give other losses from step 2 on
    if placement == "colocated":
        other = runs["ranks"][0]["lr"]["losses"]
        assert other[0] == pytest.approx(main["losses"][0], rel=REL)
        assert abs(other[1] - main["losses"][1]) > 1e-3 * main["losses"][1]


def test_trainer_logs_per_stage_metrics_and_checkpoints(runs):
    for placement in ("colocated", "disaggregated"):
        steps = _trainer_steps(_summary(runs, placement, "trainer_resumed")["log_history"])
        keys = set(steps[3])
        assert {"loss", "grad_norm", "learning_rate", "hetero/tokens_per_s", "hetero/bubble_fraction",
                "hetero/boundary_bytes", "hetero/boundary_lower_bound_bytes", "hetero/vision/forward_s",
                "hetero/vision/backward_s", "hetero/language/forward_s", "hetero/language/backward_s"} <= keys, keys
        assert steps[3]["hetero/boundary_bytes"] >= steps[3]["hetero/boundary_lower_bound_bytes"] > 0
        assert 0 <= steps[3]["hetero/bubble_fraction"] < 1
        # TFLOP/s and MFU, both scopes, as numbers (docs/throughput.md); a stage's over its own devices
        assert steps[3]["hetero/tflops_per_device/model"] > steps[3]["hetero/tflops_per_device/language"] > 0
        assert 0 < steps[3]["hetero/mfu/model"] < 1 and steps[3]["hetero/mfu/language"] > 0
        vision = steps[3]["hetero/tflops_per_device/stage/vision"]
        over_job = steps[3]["hetero/tflops_per_device/model"] - steps[3]["hetero/tflops_per_device/language"]
        if placement == "colocated":  # the vision stage holds every device: its rate is its share of the job's
            assert vision == pytest.approx(over_job, rel=1e-6), (vision, over_job)
        else:  # on 2 of the 4 devices: twice that
            assert vision == pytest.approx(2 * over_job, rel=1e-6), (vision, over_job)
        # save_total_limit=1 removed checkpoint-2 once checkpoint-4 was written
        assert all(r[f"{placement}_checkpoints"] == ["checkpoint-4"] for r in runs["ranks"])
    logged = runs["acc"]["jsonl"]
    steps = [line for line in logged if line.get("step") is not None]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert {"loss", "grad_norm", "hetero/vision/forward_s", "hetero/language/backward_s",
            "hetero/bubble_fraction", "hetero/tokens_per_s", "hetero/tflops_per_device/model",
            "hetero/mfu/language"} <= set(steps[0])


@pytest.mark.parametrize("placement", ["colocated", "disaggregated"])
def test_trainer_eval_loss_and_save_model_match_single_process(runs, placement):
    import torch
    from transformers import AutoModelForImageTextToText

    from ds_hetero.toy import ShapesCaptionDataset
    from ds_hetero.testing.parity import hf_inputs

    history = _summary(runs, placement, "trainer_resumed")["log_history"]
    evals = [h for h in history if "eval_loss" in h]
    assert [h["step"] for h in evals] == [4]
    model = AutoModelForImageTextToText.from_pretrained(runs["out"] / placement / "final", dtype=torch.float32).eval()
    held_out = [ShapesCaptionDataset.for_llava(model.config, size=8, seed=1)[i] for i in range(8)]
    with torch.no_grad():
        want = float(model(**hf_inputs("llava", model, held_out)).loss)
    assert evals[0]["eval_loss"] == pytest.approx(want, rel=REL)
    # and the checkpoint is the trained model, not the initial one
    from ds_hetero.toy import tiny_llava

    initial = tiny_llava("clip", seed=0).eval()
    with torch.no_grad():
        assert abs(float(initial(**hf_inputs("llava", initial, held_out)).loss) - want) > 1e-3


def test_hf_scheduler_drives_every_stage_like_a_stock_trainer(runs, tmp_path):
    import torch
    from transformers import Trainer, TrainingArguments

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x, labels=None):
            return {"loss": ((self.w * x - labels) ** 2).mean()}

    data = [{"x": torch.ones(1), "labels": torch.zeros(1)}] * 64
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=5, per_device_train_batch_size=16,
                             learning_rate=2e-3, lr_scheduler_type="cosine", warmup_steps=2, logging_steps=1,
                             save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True)
    stock = Trainer(model=Tiny(), args=args, train_dataset=data)
    stock.train()
    want = [h["learning_rate"] for h in stock.state.log_history if "learning_rate" in h]
    assert len(want) == 5 and len(set(want)) > 2
    for rank in runs["ranks"]:
        got = rank["lr"]
        assert got["logged"] == pytest.approx(want, rel=1e-12, abs=1e-15)
        # the lr every stage optimizer's every param group held when each step began
        assert len(got["stage_optimizers"]) == 5
        for seen, w in zip(got["stage_optimizers"], want):
            assert len(seen) == 1 and seen[0] == pytest.approx(w, rel=1e-12, abs=1e-15)


EXPECTED = {  # conflict -> words the message must hold (both values, or the fix)
    "lr": ["optimizer.params.lr=0.002", "learning_rate=0.001"],
    "batch": ["train_batch_size=16", "=8"],
    "clipping": ["gradient_clipping=1.0", "max_grad_norm=0.5"],
    "scheduler": ["'scheduler' section", "lr_scheduler_type"],
    "accumulation": ["gradient_accumulation_steps=2", "hetero_parallel.micro_batches"],
    "callback_on_stock_trainer": ["ds_hetero.HeteroTrainer(...)"],
    "stock_trainer_train": ["hetero_parallel", "HeteroTrainer"],
}


def test_every_conflict_raises_on_every_rank(runs):
    for rank in runs["ranks"]:
        errors = rank["conflicts"]
        assert set(errors) == set(EXPECTED)
        for name, words in EXPECTED.items():
            assert errors[name] is not None, f"{name}: no error"
            assert errors[name]["type"] == "HeteroConfigError", errors[name]
            assert all(w in errors[name]["message"] for w in words), (name, errors[name]["message"])
    # The YAML check depends only on the launcher's environment, identical on every rank; the
    # launcher stops the others as soon as one fails, so not every rank gets to print it.
    proc = runs["acc"]["conflict"]
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "sets mixed_precision=bf16" in text and "remove them from the accelerate YAML" in text, text[-4000:]
    assert "loss" not in proc.stdout  # no rank trained


def test_accelerate_yaml_check_names_what_the_yaml_set():
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.integrations.accelerate_prepare import check_launch_environment

    env = {"ACCELERATE_DEEPSPEED_CONFIG_FILE": "ds_configs/llava_colocated.json",
           "ACCELERATE_CONFIG_DS_FIELDS": "deepspeed_config_file,zero3_init_flag"}
    check_launch_environment(env)  # the shipped YAML's fields: fine
    env.update(ACCELERATE_CONFIG_DS_FIELDS="deepspeed_config_file,gradient_clipping,zero_stage",
               ACCELERATE_GRADIENT_CLIPPING="0.5", ACCELERATE_DEEPSPEED_ZERO_STAGE="2")
    with pytest.raises(HeteroConfigError, match=r"gradient_clipping=0.5 .*zero_stage=2"):
        check_launch_environment(env)
