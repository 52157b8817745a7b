"""Real Trainer classes made heterogeneous with one line, under the real launcher (4 CPU ranks, one launch
of tests/helpers/clients_driver.py): TRL's SFTTrainer on messages + PIL images with TRL's own collator, a plain
Trainer given that collator, a LLaMA-Factory-like Seq2SeqTrainer subclass, and the options refused.

Correctness: fp32 losses equal (1e-5 relative) to ds_hetero's engine on the same global batches, whose
first loss equals the single-process Hugging Face model's `model(**batch).loss`; TRL's token accuracy
and entropy equal the single-process model's on steps 1 and 2 (step 2 from the weights the engine
saved after step 1); num_tokens equals the batch's attention-mask sum. Negative controls: the
LLaMA-Factory-like run's sequential order gives other losses than the seeded order's.
"""

import glob
import os

import pytest

from tests.helpers.driver_report import launch_driver

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REL = 1e-5




@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("clients")
    ranks = launch_driver(ROOT, "clients_driver.py", out, timeout=900)
    return {"out": out, "ranks": ranks}


def test_reference_is_the_single_process_model(runs):
    r0 = runs["ranks"][0]
    assert r0["reference"][0] == pytest.approx(r0["hf_step1"]["loss"], rel=1e-6)
    assert r0["reference"][1] == pytest.approx(r0["hf_step2"]["loss"], rel=1e-6)


def test_sft_trainer_one_line_trains_like_the_engine_with_trl_metrics(runs):
    r0 = runs["ranks"][0]
    sft = r0["sft"]
    assert sft["losses"] == pytest.approx(r0["reference"], rel=REL)
    for log, hf in zip(sft["logs"], (r0["hf_step1"], r0["hf_step2"])):
        assert log["mean_token_accuracy"] == pytest.approx(hf["mean_token_accuracy"], rel=REL, abs=1e-9)
        assert log["entropy"] == pytest.approx(hf["entropy"], rel=REL)
    assert sft["logs"][1]["mean_token_accuracy"] > 0  # step 2 learned something: the check can tell
    # num_tokens: TRL's running count of non-padding tokens (the attention mask) of every rank's batch
    assert sft["logs"][0]["num_tokens"] == r0["hf_step1"]["num_tokens"]
    assert sft["logs"][1]["num_tokens"] == r0["hf_step1"]["num_tokens"] + r0["hf_step2"]["num_tokens"]
    for key in ("hetero/vision/forward_s", "hetero/language/backward_s", "hetero/bubble_fraction"):
        assert key in sft["logs"][0]


def test_each_rank_collates_only_its_stages_rows(runs):
    # global batch 16; language tp2 dp2 -> each rank's language share is 8 samples, and its vision dp4
    # share (4 samples) lies inside it in colocated placement: 8 rows per rank per step, not 16
    for r in runs["ranks"]:
        assert r["sft"]["rows_prepared"] == 8 * r["sft"]["steps"]
        assert r["trainer"]["rows_prepared"] == 8 * 2


def test_plain_trainer_with_trl_collator(runs):
    r0 = runs["ranks"][0]
    assert r0["trainer"]["losses"] == pytest.approx(r0["reference"], rel=REL)


def test_inline_section_from_environment(runs):
    r0 = runs["ranks"][0]  # DeepSpeed config without hetero_parallel + DS_HETERO_PARALLEL naming a file
    assert r0["inline"]["losses"] == pytest.approx(r0["reference"][:1], rel=REL)


def test_llama_factory_like_subclass(runs):
    f = runs["ranks"][0]["factory"]
    assert f["calls"] == ["_get_train_sampler", "create_optimizer", "create_scheduler"]
    assert f["losses"] == pytest.approx(f["reference"], rel=REL)  # the subclass's sequential order
    assert f["groups"] == {"vision": 2, "language": 1}  # its projector group kept, per stage
    assert abs(f["losses"][0] - runs["ranks"][0]["reference"][0]) > 1e-4  # other data, other loss


def test_options_refused_by_name_on_every_rank(runs):
    for r in runs["ranks"]:
        e = r["errors"]
        assert e["dft"]["type"] == "HeteroConfigError" and 'loss_type="dft"' in e["dft"]["message"]
        assert "label_smoothing_factor=0.1" in e["smoothing"]["message"]
        assert "ds_hetero.hetero(SFTTrainer)" in e["stock_sft_train"]["message"]


def test_tensorboard_event_file_holds_the_metrics(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = glob.glob(str(runs["out"] / "sft" / "**" / "events.out.tfevents.*"), recursive=True)
    assert files, "no tensorboard event file"
    tags = set()
    for f in files:
        acc = EventAccumulator(f)
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    for tag in ("train/loss", "train/mean_token_accuracy", "train/hetero/vision/forward_s",
                "train/hetero/language/forward_s", "train/hetero/boundary_bytes", "train/hetero/bubble_fraction"):
        assert tag in tags, sorted(tags)
