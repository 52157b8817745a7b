"""HeteroEngine against a single-process Hugging Face reference: same weights, batches, optimizer.

Losses, global gradient norms and every updated weight agree to fp32 rounding (relative 1e-5)
over 5 steps of 2 micro-batches, with gradient clipping active (the clip is below the norm).
Negative controls (SGD runs, where the update shows the gradient itself; Adam's update is
nearly invariant to the gradient's scale): a reference that clips each stage by its own norm,
or that averages the loss per micro-batch instead of over the global batch, ends with
different weights, so the comparison can fail.
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from ds_hetero.testing.parity import LLAVA_TP4, train_both
from tests.helpers.norm_share_probe import NormShareProbe
from tests.helpers.parity_checks import CLIP, check_parity

pytestmark = pytest.mark.distributed


def _sharing(engine, batches):
    return {"sharing": sorted(engine.norm_sharing)}


def _llava_suite(rank, world_size):
    probe = NormShareProbe()
    runs = {
        "homogeneous tp2dp2 zero1 adamw": dict(
            layout={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}}, zero_stage=1),
        "vision tp1dp4 + language tp2dp2 zero1 adamw": dict(
            layout={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=1,
            inspect=probe.inspect, after=probe.after),
        "vision tp1dp4 + language tp2dp2 zero2 sgd": dict(
            layout={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=2, optimizer="sgd",
            controls=True),
        "vision tp1dp4 + language tp2dp2 zero0 sgd": dict(
            layout={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=0, optimizer="sgd",
            steps=3, inspect=_sharing),
        "vision tp1dp4 + language tp2dp2 zero3 sgd": dict(
            layout={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=3, optimizer="sgd",
            steps=3, inspect=_sharing),
        "vision tp1dp4 + language tp4dp1 zero2 adamw": dict(
            layout={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 4, "dp": 1}}, zero_stage=2, model_kw=LLAVA_TP4),
    }
    return {name: train_both(rank, world_size, "llava", **{"steps": 5, "clip": CLIP, **kw}) for name, kw in runs.items()}


def _qwen_suite(rank, world_size):
    runs = {
        "qwen2-vl vision tp1dp4 + language tp2dp2 zero2 adamw": dict(
            layout={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=2),
        "qwen2-vl vision tp2dp2 + language tp1dp4 zero1 sgd": dict(
            layout={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 1, "dp": 4}}, zero_stage=1, optimizer="sgd",
            controls=True),
    }
    return {name: train_both(rank, world_size, "qwen2_vl", steps=5, clip=CLIP, **kw) for name, kw in runs.items()}


@pytest.fixture(scope="module")
def launched():
    """Both suites of this module in one 4-rank launch: {case: [its result on each rank]}."""
    cases = {"llava": (_llava_suite, {}), "qwen2_vl": (_qwen_suite, {})}
    return launch_cases(cases, world_size=4, timeout=1200)


def test_llava_layouts_match_single_process_reference(launched):
    check_parity(launched["llava"])


def test_qwen2_vl_variable_image_tokens_match_single_process_reference(launched):
    check_parity(launched["qwen2_vl"])


def test_norm_from_rank_shares_equals_deepspeeds_own_norm(launched):
    """ZeRO 1/2 stages take their gradient norm from every rank's share of its square, summed in the
    step's combining all-reduce (optimizer_step/norm_shares.py): it equals DeepSpeed's own norm of
    the stage to rounding on every step and rank; counting a replicated parameter on every tp
    rank (the negative control) does not. ZeRO 0 and 3 keep DeepSpeed's (or the manual) norm."""
    for rank, per_rank in enumerate(launched["llava"]):
        probed = per_rank["vision tp1dp4 + language tp2dp2 zero1 adamw"]
        assert probed["sharing"] == ["language", "vision"], probed["sharing"]
        assert len(probed["norm_shares"]) == 5
        for step in probed["norm_shares"]:
            for stage, (deepspeed_norm, shared, _) in step.items():
                assert abs(shared - deepspeed_norm) <= 1e-6 * deepspeed_norm, (rank, stage, step)
            _, shared, every_tp_rank = step["language"]
            assert every_tp_rank > shared * (1 + 1e-4), (rank, step)  # tp2: the replicas counted twice
        for name in ("vision tp1dp4 + language tp2dp2 zero0 sgd", "vision tp1dp4 + language tp2dp2 zero3 sgd"):
            assert per_rank[name]["sharing"] == [], (rank, name)
