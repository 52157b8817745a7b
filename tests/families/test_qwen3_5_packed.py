"""Qwen3.5 and Qwen3.5-MoE packed (`language_batching` "packed") against the single-process Hugging Face
reference on the UNPACKED batch, with the model's own loss (tests/helpers/qwen3_5_packing_parity.py).

One 4-rank launch, fp32, 5 steps, AdamW, clipping active: losses 1e-5 relative, grad norms 1e-4, every
weight 1e-5 (the MoE: the aux loss too, and every expert gathered over ep), for
- Qwen3.5: vision dp4 + language tp2 dp2, 2 micro-batches, ZeRO 1; and language tp2 pp2 cut [1, 3]
  (one Gated DeltaNet layer | two more and the full-attention layer), 4 micro-batches;
- Qwen3.5-MoE: vision dp4 + language tp2 dp2 ep2, one micro-batch (the aux loss the global batch's), ZeRO 1.
Each packed run's language rows held several samples (seen by the first Gated DeltaNet layer's
`packed_segments`), and every Gated DeltaNet layer of the stage restarts per sample
(families/qwen3_5/packed_deltanet.py), with per-sample attention in the full-attention layers.
Negative control, for both: the same packed runs with the stock Gated DeltaNet layers (the whole packed
row through each, its convolution window and recurrent state carried from sample to sample) miss the bar.
"""

import pytest

from tests.helpers.family_checks import CLIP, check_family_parity

pytestmark = pytest.mark.distributed

RTOL, ATOL = 1e-5, 1e-6
V = {"dp": 4}
DENSE = "qwen3.5 packed vision dp4 + language tp2dp2, 2 micro-batches, zero1 adamw"
PP = "qwen3.5 packed vision dp4 + language tp2 pp2 [1, 3], 4 micro-batches, zero1 adamw"
MOE = "qwen3.5-moe packed vision dp4 + language tp2dp2 ep2 zero1 adamw"
RUNS = {
    DENSE: dict(family="qwen3_5", layout={"vision": V, "language": {"tp": 2, "dp": 2}}, zero_stage=1, steps=5,
                clip=CLIP, micro_batches=2),
    # pipelined: the first chunk one Gated DeltaNet layer, the second two more and the full-attention layer
    PP: dict(family="qwen3_5", layout={"vision": V, "language": {"tp": 2, "dp": 1, "pp": 2, "pp_layers": [1, 3]}},
             zero_stage=1, steps=5, clip=CLIP, micro_batches=4),
    MOE: dict(family="qwen3_5_moe", layout={"vision": V, "language": {"tp": 2, "dp": 2, "ep": 2}}, zero_stage=1,
              steps=5, micro_batches=1),
}
CONTROLS = {f"control: {name}, state across samples": dict(RUNS[name], steps=3, stock=True) for name in (DENSE, MOE)}


@pytest.fixture(scope="module")
def runs():
    from ds_hetero.testing.cases import launch_cases
    from tests.helpers.qwen3_5_packing_parity import train_packed_qwen3_5

    cases = {name: (train_packed_qwen3_5, kw) for name, kw in {**RUNS, **CONTROLS}.items()}
    return launch_cases(cases, world_size=4, timeout=1800)


def _packed(r, restarting):
    """The run packed (a row held several samples), and each Gated DeltaNet layer the rank holds
    restarts per sample (`restarting`) or none does (the control)."""
    assert r["layers"] > 0 and r["restarting"] == (r["layers"] if restarting else 0), r
    assert r["most_in_a_row"] and max(r["most_in_a_row"]) >= 2, r["most_in_a_row"]


def test_packed_qwen3_5_matches_the_single_process_reference(runs):
    for name in (DENSE, PP):
        for r in runs[name]:
            _packed(r, restarting=True)
    # the tiny model's 3 Gated DeltaNet layers: all on each rank, or 1 | 2 over the pipeline stages
    assert [r["layers"] for r in runs[DENSE]] == [3] * 4 and [r["layers"] for r in runs[PP]] == [1, 1, 2, 2]
    check_family_parity([{DENSE: a, PP: b} for a, b in zip(runs[DENSE], runs[PP])])


def test_packed_qwen3_5_moe_matches_the_single_process_reference(runs):
    from tests.helpers.qwen3_5_packing_parity import check_moe_run

    for rank, r in enumerate(runs[MOE]):
        _packed(r, restarting=True)
        check_moe_run(rank, r, RTOL, ATOL)


def distance(r) -> dict:
    """How far a run ends from the reference: the worst relative loss and weight errors."""
    losses = max(abs(g - w) / abs(w) for g, w in zip(r["losses"], r["ref_losses"]))
    return {"loss": losses, "weight": r["weight_err"][0]}


@pytest.mark.parametrize("name", list(CONTROLS))
def test_state_carried_across_samples_misses_the_bar(runs, name):
    for r in runs[name]:
        _packed(r, restarting=False)
        d = distance(r)
        assert d["loss"] > 10 * RTOL and d["weight"] > 100 * RTOL, (name, d)
