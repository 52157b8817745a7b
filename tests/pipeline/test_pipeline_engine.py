"""A pipelined language stage (pp > 1) against the single-process Hugging Face reference.

fp32, 5 steps of 4 micro-batches, gradient clipping active (the clip is below the norm): losses
within 1e-5 relative (of the Hugging Face model's own loss too), all-stage gradient norms 1e-4,
every weight tensor a rank holds 1e-5 relative; `eval_batch` (before training) gives the Hugging
Face model's loss. Layouts on 4 ranks: colocated language pp2 dp2
with vision dp4; pp2 tp2 with vision dp4; pp4 with vision tp2 dp2; an uneven cut [1, 3];
first_stage (vision tp2 on the 2 ranks of pipeline stage 0, language pp2 tp2); disaggregated
vision dp1 on rank 0 + language pp3 on ranks 1-3; Qwen2-VL pp2 with variable image-token counts
and text-only samples. Negative control: a last pipeline stage that sends zeros back instead of
its input gradient ends with different weights on the first pipeline stage.
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from tests.helpers.pipeline_parity import (FOUR_LAYERS, bf16_losses, drop_pipeline_gradient, evaluate_first,
                                           per_shard_loading, run_layouts, save_pretrained_roundtrip)

pytestmark = pytest.mark.distributed

RTOL = 1e-5
ATOL = 1e-6
CLIP = 0.3
CONTROL = "pp2dp2 gradient not sent back (negative control) sgd"


def _suite_a(rank, world_size):
    return run_layouts(rank, world_size, {
        "vision dp4 + language pp2dp2 zero1 adamw": dict(
            layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=1, inspect=evaluate_first),
        "vision dp4 + language pp2tp2 zero2 sgd": dict(
            layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 1, "pp": 2}}, zero_stage=2, optimizer="sgd"),
        "vision tp2dp2 + language pp4 zero1 adamw": dict(
            layout={"vision": {"tp": 2, "dp": 2}, "language": {"dp": 1, "pp": 4}}, zero_stage=1),
        CONTROL: dict(layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=1, optimizer="sgd",
                      steps=2, inspect=drop_pipeline_gradient),
    })


def _suite_b(rank, world_size):
    return run_layouts(rank, world_size, {
        "vision dp4 + language pp2dp2 pp_layers [1, 3] zero0 sgd": dict(
            layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2, "pp_layers": [1, 3]}}, zero_stage=0,
            optimizer="sgd"),
        "first_stage vision tp2 + language pp2tp2 zero1 adamw": dict(
            layout={"vision": {"tp": 2, "dp": 1}, "language": {"tp": 2, "dp": 1, "pp": 2}}, zero_stage=1,
            placement="first_stage"),
        "disaggregated vision dp1 rank 0 + language pp3 ranks 1-3 zero1 adamw": dict(
            layout={"vision": {"dp": 1}, "language": {"dp": 1, "pp": 3}}, zero_stage=1, placement="disaggregated",
            inspect=evaluate_first),
        "qwen2-vl vision dp4 + language pp2dp2 zero2 adamw": dict(
            family="qwen2_vl", layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=2),
    })


def _check(results):
    control_seen, evaluated = False, set()
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0, (rank, name, "no weight tensor was compared")
            if name == CONTROL:
                if r["pp_coord"] == 0:  # the first pipeline stage trained on no language gradient
                    assert err > 100 * RTOL and abs_err > 100 * ATOL, (rank, name, r["weight_err"])
                    control_seen = True
                continue
            assert len(r["losses"]) == len(r["ref_losses"]) == len(r["hf_losses"]) == 5, (rank, name)
            for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
                assert abs(got - want) <= RTOL * abs(want), (rank, name, r["losses"], r["ref_losses"])
                assert abs(got - hf) <= RTOL * abs(hf), (rank, name, r["losses"], r["hf_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
            assert min(r["ref_norms"]) > CLIP, r["ref_norms"]  # clipping was active on every step
            assert err <= RTOL and abs_err <= ATOL, (rank, name, err, where, abs_err)
            for total, bound in r["boundary"]:
                assert total == bound, (name, total, bound)
            if "eval_loss" in r:  # eval_batch before training: the Hugging Face model's first loss
                assert abs(r["eval_loss"] - r["hf_losses"][0]) <= RTOL * abs(r["hf_losses"][0]), (rank, name, r)
                evaluated.add(name)
    return control_seen, evaluated


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every check of this module in one 4-rank launch: {case: [its result on each rank]}."""
    from ds_hetero.testing.parity import build_model

    tmp = tmp_path_factory.mktemp("pipeline_engine")
    checkpoint = str(tmp / "model")
    build_model("llava", seed=7, **FOUR_LAYERS).save_pretrained(checkpoint)
    (tmp / "saved").mkdir()
    cases = {"layouts": (_suite_a, {}), "placements": (_suite_b, {}), "bf16": (bf16_losses, {}),
             "save_pretrained": (save_pretrained_roundtrip, {"tmp": str(tmp / "saved")}),
             "per_shard_loading": (per_shard_loading, {"checkpoint": checkpoint})}
    return launch_cases(cases, world_size=4, timeout=3000)


def test_pipeline_layouts_match_single_process_reference(launched):
    """pp2 dp2, pp2 tp2, pp4 with a tp2 encoder, and the negative control."""
    control_seen, evaluated = _check(launched["layouts"])
    assert control_seen, "the negative control did not run"
    assert evaluated == {"vision dp4 + language pp2dp2 zero1 adamw"}, evaluated


def test_pipeline_placements_match_single_process_reference(launched):
    """An uneven cut, first_stage, disaggregated into a pp3 pipeline, Qwen2-VL with variable image tokens."""
    _, evaluated = _check(launched["placements"])
    assert evaluated == {"disaggregated vision dp1 rank 0 + language pp3 ranks 1-3 zero1 adamw"}, evaluated


def test_pipeline_bf16_trains_the_same_function(launched):
    """bf16 with ZeRO 1 against fp32 with ZeRO 2 on the same layout and batches (bf16 rounding:
    losses within 2e-2 relative; a wrong gradient scale or a dropped gradient would exceed it
    by the third step)."""
    for r in launched["bf16"]:
        assert r["bf16"]["dtype"] == "torch.bfloat16" and r["fp32"]["dtype"] == "torch.float32"
        for got, want in zip(r["bf16"]["losses"], r["fp32"]["losses"]):
            assert abs(got - want) <= 2e-2 * abs(want), r
        for got, want in zip(r["bf16"]["norms"], r["fp32"]["norms"]):
            assert abs(got - want) <= 5e-2 * abs(want), r


def test_pipeline_save_pretrained(launched):
    """save_pretrained with pp2 tp2: one file per pipeline stage; from_pretrained reads exactly the
    live weights of every rank (and they differ from the untrained ones: the check can fail)."""
    r = launched["save_pretrained"][0]
    assert r["names"][0] and r["names"][1] > 0, r
    assert r["diff"] == 0.0, r
    assert r["control"] > 1e-3, r
    assert [f for f in r["files"] if f.endswith(".safetensors")] == [
        "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"], r


def test_pipeline_per_shard_loading(launched):
    """weights= with pp2 tp2: each rank reads its pipeline stage's layers only and trains exactly
    like the same layout built from the full model."""
    for rank, r in enumerate(launched["per_shard_loading"]):
        built, loaded = r["built"], r["loaded"]
        for got, want in zip(loaded["losses"], built["losses"]):
            assert abs(got - want) <= RTOL * abs(want), (rank, loaded["losses"], built["losses"])
        assert r["same_names"] and r["weight_diff"] <= 1e-6, (rank, r["weight_diff"])
        # pipeline stage 0 (ranks 0, 1) holds layers 0-1, stage 1 (ranks 2, 3) layers 2-3
        mine = [rank >= 2] * 2 + [rank < 2] * 2
        assert loaded["meta_layers"] == mine, (rank, loaded["meta_layers"])
        read, full = loaded["report"]["language"]
        assert 0 < read < full, (rank, loaded["report"])  # a pipeline stage's layers, tp rows: less than the whole
