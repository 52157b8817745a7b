"""A frozen encoder (`stages.<name>.freeze: true`) with a pipelined language stage (pp > 1).

Distributed, 4 ranks, against the single-process Hugging Face reference that freezes the same
parameters (fp32, 3 steps of 4 micro-batches, clipping active: losses 1e-5 relative and HF's own
loss, norms 1e-4, every weight tensor 1e-5), the frozen parameters bit-identical to their initial
values and no byte sent in the boundary's backward:
    colocated    vision dp4 frozen + language pp2 dp2 (the fill-and-drain order)
    colocated    vision dp4 frozen + language pp2 dp2, the phased order
    first_stage  vision dp2 frozen + language pp2 dp2 (encoder passes inline in stage 0's 1F1B)
    disaggregated vision dp1 (rank 0) frozen + language pp3 (ranks 1-3)
Negative control: the same colocated layout with the vision stage trained sends row gradients
back and moves the vision weights (what the frozen runs must not do). Without the fix each frozen
run crashed at step 0 on every rank ("element 0 of tensors does not require grad"). The order
itself (a frozen encoder's passes: forward and rows exchange only) is tested pure in
tests/pipeline/test_pipeline_fill_drain.py.
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from ds_hetero.testing.parity import train_both
from tests.helpers.memory_parity import check_parity, freeze_names, frozen_report

VISION = ["model.vision_tower.", "model.multi_modal_projector."]
FROZEN_V4 = {"dp": 4, "freeze": True}
PP2DP2 = {"dp": 2, "pp": 2}
CONTROL = "control: vision trained, colocated vision dp4 + language pp2dp2"


def _suite(rank, world_size):
    import ds_hetero.schedule.pipeline as pipeline

    frozen = dict(freeze_reference=lambda m: freeze_names(m, VISION), after=frozen_report(VISION))
    runs = {
        "colocated vision dp4 frozen + language pp2dp2 zero1 adamw": dict(
            layout={"vision": FROZEN_V4, "language": PP2DP2}, zero_stage=1, **frozen),
        "colocated vision dp4 frozen + language pp2dp2 phased zero1 sgd": dict(
            layout={"vision": FROZEN_V4, "language": PP2DP2}, zero_stage=1, optimizer="sgd", phased=True, **frozen),
        "first_stage vision dp2 frozen + language pp2dp2 zero1 adamw": dict(
            layout={"vision": {"dp": 2, "freeze": True}, "language": PP2DP2}, zero_stage=1,
            placement="first_stage", **frozen),
        "disaggregated vision dp1 frozen + language pp3 zero1 adamw": dict(
            layout={"vision": {"dp": 1, "freeze": True}, "language": {"dp": 1, "pp": 3}}, zero_stage=1,
            placement="disaggregated", **frozen),
        CONTROL: dict(layout={"vision": {"dp": 4}, "language": PP2DP2}, zero_stage=1, after=frozen_report(VISION)),
    }
    out = {}
    for name, kw in runs.items():
        phased = kw.pop("phased", False)
        pipeline.PipelineSchedule.fill_drain = not phased
        try:
            out[name] = train_both(rank, world_size, "llava", **{
                "steps": 3, "clip": 0.3, "micro_batches": 4, "batch_size": 16, "model_kw": {"text_layers": 4},
                **kw})
        finally:
            pipeline.PipelineSchedule.fill_drain = True
    return out


@pytest.fixture(scope="module")
def launched():
    return launch_cases({"suite": (_suite, {})}, world_size=4, timeout=1800)["suite"]


@pytest.mark.distributed
def test_frozen_encoder_with_pipeline_matches_reference(launched):
    check_parity([{n: r for n, r in per_rank.items() if n != CONTROL} for per_rank in launched])
    for rank, per_rank in enumerate(launched):
        for name, r in per_rank.items():
            if name == CONTROL:
                continue
            assert r["trains"]["vision"] is False, (rank, name)
            assert r["backward_bytes"] == [0] * 3, (rank, name, r["backward_bytes"])  # no row gradient sent
            if "vision" in r["stages_held"]:
                assert r["frozen_compared"] > 0 and r["frozen_identical"], (rank, name)
                assert r["optimizer_params"]["vision"] == 0, (rank, name)


@pytest.mark.distributed
def test_trained_encoder_control_sends_gradients(launched):
    check_parity([{CONTROL: per_rank[CONTROL]} for per_rank in launched])
    assert any(sum(per_rank[CONTROL]["backward_bytes"]) > 0 for per_rank in launched)
    for per_rank in launched:
        assert per_rank[CONTROL]["frozen_compared"] > 0 and not per_rank[CONTROL]["frozen_identical"]
