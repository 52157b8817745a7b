"""The Qwen2.5-Omni thinker trained on its processor's own sample form, against the single-process thinker.

Every sample is Qwen2_5OmniProcessor's whole output for it (built locally: tests/helpers/family_processors.py):
input_ids [1, S], attention_mask, pixel_values + image_grid_thw, input_features [clips, mel, 3000]
padded + feature_attention_mask; images, clips, both (several, interleaved) or neither. The reference
is the unmodified thinker on those fields batched (its own `model(**batch).loss`). fp32, 3 steps of 2
micro-batches, clipping active: losses within 1e-5 relative, global gradient norms 1e-4, every weight
1e-5 (the bar of tests/engine/test_omni_parity.py), in two layouts (one 4-rank launch).
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from ds_hetero.testing.parity import train_both

pytestmark = pytest.mark.distributed

RTOL, ATOL, CLIP, STEPS = 1e-5, 1e-6, 0.3, 3
ITEMS = [[("audio", 0.2)], [("image", (32, 32)), ("audio", 0.13)], [], [("audio", 0.3), ("image", (16, 32)),
         ("audio", 0.17)], [("image", (16, 16))], [("audio", 0.24)], [("image", (32, 16)), ("image", (16, 16))],
         [("audio", 0.16), ("image", (16, 16))]]
LAYOUTS = {
    "colocated vision dp4 + audio tp2dp2 + language tp2dp2": dict(
        layout={"vision": {"tp": 1, "dp": 4}, "audio": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}}),
    "mixed vision dp2 [0,1] + audio dp2 [2,3] + language tp2 [0,1]": dict(
        layout={"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 2, "ranks": [2, 3]},
                "language": {"tp": 2, "dp": 1, "ranks": [0, 1]}}, placement="mixed"),
}


def processor_batches(family, model, steps, batch_size):
    from tests.helpers.family_processors import omni_processor_samples, qwen2_5_omni_processor

    processor = qwen2_5_omni_processor(model)
    return [omni_processor_samples(processor, model, (ITEMS * 2)[step:step + batch_size], seed=50 + step)
            for step in range(steps)]


def _runs(rank, world_size):
    return {name: train_both(rank, world_size, "omni", zero_stage=1, steps=STEPS, clip=CLIP,
                             make_data=processor_batches, **kw) for name, kw in LAYOUTS.items()}


@pytest.fixture(scope="module")
def launched():
    return launch_cases({"runs": (_runs, {})}, world_size=4, timeout=1800)["runs"]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_omni_trains_at_parity_on_its_processors_samples(launched, name):
    for rank, per_rank in enumerate(launched):
        r = per_rank[name]
        assert len(r["losses"]) == STEPS
        for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
            assert abs(want - hf) <= RTOL * abs(hf), (rank, r["ref_losses"], r["hf_losses"])
            assert abs(got - hf) <= RTOL * abs(hf), (rank, r["losses"], r["hf_losses"])
        for got, want in zip(r["norms"], r["ref_norms"]):
            assert abs(got - want) <= 1e-4 * abs(want), (rank, r["norms"], r["ref_norms"])
        assert min(r["ref_norms"]) > CLIP, r["ref_norms"]  # clipping was active
        err, where, abs_err, compared = r["weight_err"]
        assert compared > 0 and err <= RTOL and abs_err <= ATOL, (rank, err, where, abs_err)
