"""A stage with no work in a step (a global batch without any image) takes no optimizer step, as
one process leaves parameters without a gradient (optimizer_step/idle_stages.py).

Qwen2-VL trained image, text-only, image, image batches, AdamW with weight decay and a
(constant) DeepSpeed lr scheduler, against the single-process Hugging Face run of the same
batches (where the vision tower's parameters have no gradient in the text-only step, so AdamW
leaves their weights, moments and step count alone): losses, gradient norms and every weight
within the usual bar, at ZeRO 0-3, with the stages sharing one engine (ZeRO 0 and 1) and on
engines of their own, disaggregated, and with a pipelined language stage. Every engine's
counters (global steps, lr scheduler position) advance in the text-only step and none counts
it as skipped. Negative control: a reference that steps the vision tower on zero gradients (what
DeepSpeed's engines do by themselves) is far from every run. A checkpoint saved after the
text-only step carries each stage's own optimizer step count into other layouts (shared ZeRO 0 ->
separate engines ZeRO 1 -> shared ZeRO 1). One 2-rank launch.
"""

import pytest

from ds_hetero.testing.launch import run_distributed
from tests.helpers.idle_stage_parity import STEPS, TEXT_ONLY
from tests.helpers.parity_checks import RTOL

pytestmark = pytest.mark.distributed

RUNS = {
    "shared engine zero0": dict(layout={"vision": {"dp": 2}, "language": {"dp": 2}}, zero_stage=0),
    "shared engine zero1": dict(layout={"vision": {"dp": 2}, "language": {"dp": 2}}, zero_stage=1),
    "separate engines zero2": dict(layout={"vision": {"dp": 2}, "language": {"tp": 2, "dp": 1}}, zero_stage=2),
    "separate engines zero3": dict(layout={"vision": {"dp": 2}, "language": {"tp": 2, "dp": 1}}, zero_stage=3),
    "disaggregated zero1": dict(layout={"vision": {"dp": 1, "ranks": [0]}, "language": {"dp": 1, "ranks": [1]}},
                                zero_stage=1, placement="disaggregated"),
    "language pp2 zero1": dict(layout={"vision": {"dp": 2}, "language": {"pp": 2, "dp": 1}}, zero_stage=1),
}
SHARED = {"shared engine zero0", "shared engine zero1"}


def _runs(rank, world_size, tmp):
    from ds_hetero.testing.parity import train_both
    from tests.helpers.idle_stage_parity import (SCHEDULER, batches_with_text_only_steps, checkpoint_chain,
                                                 counters_and_control, idle_per_step)

    out = {name: train_both(rank, world_size, "qwen2_vl", steps=STEPS, clip=0.3, make_data=batches_with_text_only_steps,
                            inspect=idle_per_step, after=counters_and_control, ds_config=SCHEDULER, **kw)
           for name, kw in RUNS.items()}
    out["checkpoint"] = checkpoint_chain(rank, tmp)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_distributed(_runs, world_size=2, timeout=1200, args=(str(tmp_path_factory.mktemp("idle")),))


@pytest.mark.parametrize("name", list(RUNS))
def test_text_only_step_leaves_vision_as_one_process(results, name):
    for rank, r in enumerate(results):
        r = r[name]
        assert r["idle"] == [["vision"] if s in TEXT_ONLY else [] for s in range(STEPS)], r["idle"]
        assert bool(r["shared"]) == (name in SHARED), (name, r["shared"])
        for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
            assert abs(got - want) <= RTOL * abs(want), (rank, name, r["losses"], r["ref_losses"])
            assert abs(got - hf) <= RTOL * abs(hf), (rank, name, r["losses"], r["hf_losses"])
        for got, want in zip(r["norms"], r["ref_norms"]):
            assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
        err, where, abs_err, compared = r["weight_err"]
        assert compared > 0 and err <= RTOL, (rank, name, err, where, abs_err)
        # negative control: stepping zero gradients is far outside the bar
        assert r["control_err"] > 100 * RTOL, (rank, name, r["control_err"])
        assert r["skipped"] == [False] * STEPS, (rank, name, r["skipped"])
        # every engine (the idle stage's too) counted four applied steps, its scheduler where the
        # language stage's is
        assert {c[:2] for c in r["counters"].values()} == {(STEPS, 0)}, (rank, name, r["counters"])
        assert len({c[2] for c in r["counters"].values()}) == 1, (rank, name, r["counters"])

def test_checkpoint_after_text_only_step_moves_between_layouts(results):
    for rank, r in enumerate(results):
        r = r["checkpoint"]
        assert r["owners"] == [["language", "vision"], [], ["language", "vision"]], r["owners"]
        err, where, abs_err, compared = r["weight_err"]
        assert compared > 0 and err <= RTOL, (rank, err, where, abs_err)
