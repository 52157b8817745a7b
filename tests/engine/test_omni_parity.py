"""Qwen2.5-Omni thinker (vision + audio + language) against the single-process Hugging Face thinker.

Every encoder stage has its own layout and placement (and, colocated, its own passes per step
and balancing); losses (the thinker's own
`model(**batch).loss`), global gradient norms and every updated weight agree to fp32 rounding
(relative 1e-5) over 5 steps of 2 micro-batches with clipping active. Batches mix samples with
an image only, audio only, both (interleaved in either order, several items), and neither.

Negative control: the language stage takes the audio rows at the image placeholders and the
image rows at the audio placeholders (samples whose image and clip have the same row count, so
the run goes through): the losses then differ from the reference.
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from ds_hetero.testing.parity import train_both

pytestmark = pytest.mark.distributed

RTOL, ATOL, CLIP = 1e-5, 1e-6, 0.3

RUNS = {
    "colocated vision dp4 + audio tp2dp2 + language tp2dp2 zero1 adamw": dict(
        layout={"vision": {"tp": 1, "dp": 4}, "audio": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}},
        zero_stage=1),
    "colocated vision tp2dp2 one pass, position + audio dp4 balanced + language tp2dp2 zero2 sgd": dict(
        layout={"vision": {"tp": 2, "dp": 2, "micro_batches": 1, "balance": "position"}, "audio": {"dp": 4},
                "language": {"tp": 2, "dp": 2}},
        zero_stage=2, optimizer="sgd", hetero={"balance": "tokens"}),
    "disaggregated vision dp2 [0,1] + audio dp1 [2] + language dp1 [3] zero1 adamw": dict(
        layout={"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 1, "ranks": [2]},
                "language": {"dp": 1, "ranks": [3]}},
        zero_stage=1, placement="disaggregated"),
    "mixed vision dp2 on the language ranks [0,1] + audio dp2 [2,3] + language tp2 zero2 sgd": dict(
        layout={"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 2, "ranks": [2, 3]},
                "language": {"tp": 2, "dp": 1, "ranks": [0, 1]}},
        zero_stage=2, placement="mixed", optimizer="sgd"),
}


def _suite(rank, world_size, runs):
    return {name: train_both(rank, world_size, "omni", steps=5, clip=CLIP, **RUNS[name]) for name in runs}


def _same_size_items(family, model, steps, batch_size):
    """Every sample: a 4-row image and a 4-row clip (16 frames), in either order, so swapped rows fit."""
    from ds_hetero.testing.omni_samples import omni_samples

    pairs = [[("image", (1, 4, 4)), ("audio", 16)], [("audio", 16), ("image", (1, 4, 4))]]
    return [omni_samples(model, (pairs * batch_size)[:batch_size], text_len=3 + step, seed=300 + step)
            for step in range(steps)]


def _swap_rows(engine, batches):
    """Deliver the audio rows at the image placeholders and the image rows at the audio ones."""
    language = engine.stages.language.module
    language.token_ids = tuple(reversed(language.token_ids))
    return {}


def _control(rank, world_size):
    layout = RUNS[next(iter(RUNS))]
    kw = dict(steps=2, clip=CLIP, make_data=_same_size_items, **layout)
    return {"right": train_both(rank, world_size, "omni", **kw),
            "swapped": train_both(rank, world_size, "omni", inspect=_swap_rows, **kw)}


def _check(results):
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            assert len(r["losses"]) == len(r["ref_losses"]) == 5, (rank, name)
            for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
                assert abs(want - hf) <= RTOL * abs(hf), (rank, name, r["ref_losses"], r["hf_losses"])
                assert abs(got - hf) <= RTOL * abs(hf), (rank, name, r["losses"], r["hf_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
            assert min(r["ref_norms"]) > CLIP, r["ref_norms"]  # clipping was active
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0, (rank, name, "no weight tensor was compared")
            assert err <= RTOL and abs_err <= ATOL, (rank, name, err, where, abs_err)
            for total, bound in r["boundary"]:
                assert total == bound, (name, total, bound)


@pytest.fixture(scope="module")
def launched():
    """Every check of this module in one 4-rank launch: {case: [its result on each rank]}."""
    cases = {"colocated": (_suite, {"runs": [n for n in RUNS if n.startswith("colocated")]}),
             "disaggregated": (_suite, {"runs": [n for n in RUNS if not n.startswith("colocated")]}),
             "control": (_control, {})}
    return launch_cases(cases, world_size=4, timeout=2400)


def test_omni_colocated_matches_the_single_process_thinker(launched):
    _check(launched["colocated"])


def test_omni_disaggregated_and_mixed_match_the_single_process_thinker(launched):
    _check(launched["disaggregated"])


def test_omni_audio_rows_at_the_image_positions_fail_the_comparison(launched):
    for per_rank in launched["control"]:
        right, swapped = per_rank["right"], per_rank["swapped"]
        for got, hf in zip(right["losses"], right["hf_losses"]):  # the same data, rows in place: parity
            assert abs(got - hf) <= RTOL * abs(hf), (right["losses"], right["hf_losses"])
        worst = max(abs(got - hf) / abs(hf) for got, hf in zip(swapped["losses"], swapped["hf_losses"]))
        assert worst > 100 * RTOL, (swapped["losses"], swapped["hf_losses"])
        assert swapped["weight_err"][0] > 100 * RTOL, swapped["weight_err"]
