"""ZeRO 3 on an encoder stage whose dp ranks do not all get an image in a pass (Qwen2-VL).

A vision rank with no image still runs its stage on the smallest dummy image and multiplies the
rows by zero (models/language_stage.empty_rows), so its ZeRO-3 parameter gathers, its module trace and
its backward's reduce-scatters are those of its dp peers. That dummy pass used to call the
stage module from inside its own forward: DeepSpeed's ZeRO-3 hook on the root module
(`_start_of_forward_hook` -> `reset_step`, whose trace check is a world-group collective while
the trace is being recorded) then ran once more on that rank than on the others, and the step
hung. One 4-rank launch: the parity bar (fp32, 5 steps, clipping active, losses and grad norms
against the single-process Hugging Face model's own loss, every weight within 1e-5) for vision
dp4 under ZeRO 3 with language tp2 dp2 and with language dp4, both with passes where a vision
rank encodes nothing (asserted from the plan). Negative control: the old nested call, in its own
launch with a short deadline, does not finish.
"""

import pytest

from ds_hetero.testing.launch import RankFailure, run_distributed
from tests.helpers.parity_checks import CLIP, RTOL
from tests.helpers.zero3_empty_encoder import nested_dummy_pass, qwen2_vl_zero3_runs

pytestmark = pytest.mark.distributed

RUNS = {
    "vision dp4 zero3 + language tp2dp2 sgd": dict(
        layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=3, optimizer="sgd",
        micro_batches=2, batch_size=8),
    "vision dp4 zero3 + language dp4 adamw": dict(
        layout={"vision": {"dp": 4}, "language": {"dp": 4}}, zero_stage=3, micro_batches=4, batch_size=16),
}


def _parity(rank, world_size):
    return qwen2_vl_zero3_runs(rank, world_size, RUNS)


def test_zero3_vision_rank_without_image_matches_reference():
    results = run_distributed(_parity, world_size=4, timeout=1200)
    for name in RUNS:
        empty = [(rank, step, v) for rank, r in enumerate(results)
                 for step, counts in enumerate(r[name]["images"]) for v, n in enumerate(counts) if n == 0]
        assert empty, (name, "no vision rank ran a pass without an image: the test would not test it")
        for rank, r in enumerate(results):
            r = r[name]
            for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
                assert abs(got - want) <= RTOL * abs(want), (rank, name, r["losses"], r["ref_losses"])
                assert abs(got - hf) <= RTOL * abs(hf), (rank, name, r["losses"], r["hf_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
            assert min(r["ref_norms"]) > CLIP, r["ref_norms"]
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0 and err <= RTOL, (rank, name, err, where, abs_err)


def test_nested_dummy_pass_hangs_under_zero3():
    """Negative control: the stage called from inside its own forward (the old empty-rows path)."""
    results = run_distributed(nested_dummy_pass, world_size=4, timeout=120, check=False,
                              pg_timeout_s=10)  # the hang ends in 10 s (hetero timeout_s), not gloo's default 60
    failed = [r for r in results if isinstance(r, RankFailure)]
    assert failed, results
    assert any("Timed out" in str(r) or "stopped answering" in str(r) for r in failed), failed  # a hang, not a crash
    assert any("failed in step 0" in str(r) for r in failed), failed  # in the step, not while building the engine
