"""`ds-hetero plan --price CONFIG.json` prices exactly the given layout: the same prediction the search gives
that candidate, its figures in both FLOP scopes, as text and JSON, and validate's refusal of a bad config."""

from __future__ import annotations

import json

import pytest

from ds_hetero.cli import main
from ds_hetero.planner import Candidate, StageChoice, machine_profile, plan
from ds_hetero.planner.price import candidate_of, price, validated

SECTION = {"placement": "colocated", "micro_batches": 2,
           "stages": {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}}
CONFIG = {"train_batch_size": 8, "zero_optimization": {"stage": 1},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "hetero_parallel": SECTION}
PRICE = ["plan", "--model", "tiny-llava", "--world-size", "4", "--seq-len", "96", "--image-tokens", "16",
         "--machine", "h100"]


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


def test_priced_layout_equals_the_searched_candidate():
    """The same candidate, found by the search, has the same step time: --price is the planner's model."""
    machine = machine_profile("h100")
    priced = price("tiny-llava", CONFIG, 4, 96, machine, image_tokens=16)
    want = Candidate("colocated", StageChoice(1, 4), StageChoice(2, 2), 2)
    assert priced.prediction.candidate.label() == want.label()
    searched = plan("tiny-llava", 4, 96, 16, 8, machine, base=CONFIG, placements=("colocated",),
                    micro_batches=(2,), modelled=False)
    same = [p for p in searched.predictions if p.candidate.label() == want.label()]
    assert same and same[0].step_s == pytest.approx(priced.step_s, rel=1e-12)


def test_scopes_and_per_gpu_figures():
    priced = price("tiny-llava", CONFIG, 4, 96, machine_profile("h100"), image_tokens=16)
    assert 0 < priced.language_flops < priced.model_flops  # the encoder's FLOPs are in the whole-model scope only
    assert priced.tflops_per_gpu("model") == pytest.approx(priced.model_flops / priced.step_s / 4 / 1e12)
    assert priced.tokens_per_s_per_gpu == pytest.approx(8 * 96 / priced.step_s / 4)


def test_disaggregated_and_first_stage_layouts_become_their_candidates():
    # (the tiny model has 2 decoder layers: a pipeline of 2 at most)
    disagg = {**CONFIG, "train_batch_size": 6, "hetero_parallel": {"placement": "disaggregated", "micro_batches": 2, "stages": {
        "vision": {"tp": 1, "dp": 1, "ranks": [0]}, "language": {"tp": 1, "dp": 3, "ranks": [1, 2, 3],
                                                                "recompute": True}}}}
    cand = candidate_of(validated(disagg, 4, _adapter()))
    assert cand.placement == "disaggregated" and cand.vision.ranks == (0,)
    assert cand.language.dp == 3 and cand.language.recompute and cand.language.ranks == (1, 2, 3)
    first = {**CONFIG, "train_batch_size": 4, "hetero_parallel": {
        "placement": "first_stage", "micro_batches": 2, "stages": {
            "vision": {"tp": 1, "dp": 2}, "language": {"tp": 1, "dp": 2, "pp": 2}}}}
    cand = candidate_of(validated(first, 4, _adapter()))
    assert cand.megatron and cand.language.pp == 2 and cand.vision.ranks == ()


def _adapter():
    from ds_hetero.families import adapter_for
    from ds_hetero.planner.model_source import load_model

    return adapter_for(load_model("tiny-llava")[1])


def test_cli_text_and_json(config_file, capsys):
    assert main(PRICE + ["--price", config_file]) == 0
    text = capsys.readouterr().out
    assert "TFLOP/s per GPU" in text and "(language only)" in text and "memory per rank" in text
    assert main(PRICE + ["--price", config_file, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["tflops_per_gpu"]) == {"model", "language"}
    assert out["step_s"] > 0 and out["tokens_per_s_per_gpu"] > 0 and out["memory_gb_per_rank"]
    assert {"vision", "language"} <= set(out["breakdown_s"])


def test_cli_refuses_what_validate_refuses(tmp_path, capsys):
    bad = {**CONFIG, "hetero_parallel": {**SECTION, "stages": {"vision": {"tp": 1, "dp": 4},
                                                               "language": {"tp": 3, "dp": 2}}}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    assert main(["validate", str(path), "--world-size", "4", "--model", "tiny-llava"]) != 0
    validate_err = capsys.readouterr()
    assert main(PRICE + ["--price", str(path)]) == 1
    err = capsys.readouterr().err
    assert "tp x cp x dp = 3 x 1 x 2" in err and "tp x cp x dp = 3 x 1 x 2" in validate_err.out + validate_err.err


def test_cli_global_batch_must_agree(config_file, capsys):
    assert main(PRICE + ["--price", config_file, "--global-batch", "16"]) == 1
    assert "train_batch_size 8" in capsys.readouterr().err
