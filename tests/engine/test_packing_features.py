"""Packed language micro-batches with every per-stage feature, against the single-process reference.

The bar of test_packing_engine.py (fp32, the unmodified Hugging Face model on the UNPACKED, padded
batch, 5 steps, clipping active: losses 1e-5 relative, grad norms 1e-4, every weight 1e-5, boundary
bytes at the lower bound; eval_batch packs as training does), in one 4-rank launch, one test per case:
activation recompute (every stage; and on a cp2 + sp language stage, where the stage passes the
packed block mask itself), a frozen vision stage, a frozen part of the language stage (fnmatch
patterns), PEFT LoRA on every attention and MLP linear (language tp 2), tied input/output
embeddings at tp 2 and with pp 2 (the head's copy on the last pipeline stage), and the `mixed`
placement (the two-encoder omni thinker: vision on the language ranks, audio on its own). LoRA with
dropout 0.1 under tp: recompute replays the forward's masks (losses and norms equal with and without
recompute, 1e-6; differ without dropout), since no single process can draw a packed sharded row's masks.
Also recompute on a pp2 language stage with the tower frozen. Frozen parameters stay bit-identical.
Every case attends per sample (sdpa with no `packed_attention` key: models/per_sample_attention.py),
checked on every language rank.
Negative controls (must miss the bar): tied pp2 with the copies' gradients not summed; LoRA with
the packed positions not restarted (more controls of packing itself in test_packing_engine.py).
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from tests.helpers.packing_features import lora_dropout_recompute, measured, train_packed_with
from tests.helpers.parity_checks import RTOL, check_parity

pytestmark = pytest.mark.distributed

V4 = {"dp": 4}
L22 = {"tp": 2, "dp": 2}
VISION = ["model.vision_tower.", "model.multi_modal_projector."]
LAYER0 = ["model.language_model.layers.0."]
TIED = {"tie_word_embeddings": True}

CASES = {
    "recompute: vision dp4 + language tp2dp2, both recomputed": dict(
        family="llava", layout={"vision": {**V4, "recompute": True}, "language": {**L22, "recompute": True}}),
    "recompute: language tp2 cp2 sp recomputed, qwen2-vl": dict(
        family="qwen2_vl", layout={"vision": V4, "language": {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True,
                                                               "recompute": True}}),
    "recompute + freeze: language pp2dp2 recomputed, tower frozen by config": dict(
        family="llava", frozen=["model.vision_tower."],
        layout={"vision": {**V4, "freeze": ["tower"]}, "language": {"dp": 2, "pp": 2, "recompute": True}}),
    "freeze: vision stage frozen by config": dict(
        family="llava", layout={"vision": {**V4, "freeze": True}, "language": L22},
        frozen=VISION),
    "freeze: language layer 0 frozen by pattern, zero 2": dict(
        family="llava", layout={"vision": V4, "language": {**L22, "freeze": ["model.language_model.layers.0.*"]}},
        zero_stage=2, frozen=LAYER0),
    "lora: adapters on every linear, vision dp4 + language tp2dp2 adamw": dict(
        family="llava", layout={"vision": V4, "language": L22}, optimizer="adamw", lora=True),
    "tied: language tp2dp2": dict(family="llava", layout={"vision": V4, "language": L22}, model_kw=TIED),
    "tied: language pp2dp2, qwen2-vl": dict(
        family="qwen2_vl", layout={"vision": V4, "language": {"dp": 2, "pp": 2}},
        model_kw={**TIED, "text_layers": 4}),
    "mixed: omni vision dp2 on the language ranks + audio dp2 + language tp2": dict(
        family="omni", layout={"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 2, "ranks": [2, 3]},
                               "language": {"tp": 2, "dp": 1, "ranks": [0, 1]}},
        placement="mixed", zero_stage=2),
}
# must miss the bar: shows that the tied pp case checks the head's copy, and that a LoRA run
# notices packing done wrong
CONTROLS = {
    "control: tied pp2dp2, the copies' gradients not summed": dict(
        CASES["tied: language pp2dp2, qwen2-vl"], steps=2, control="tied copies not summed"),
    "control: lora, packed positions not restarted": dict(
        CASES["lora: adapters on every linear, vision dp4 + language tp2dp2 adamw"], steps=2,
        control="positions not restarted"),
}


@pytest.fixture(scope="module")
def launched():
    cases = {name: (train_packed_with, kw) for name, kw in {**CASES, **CONTROLS}.items()}
    cases["lora dropout"] = (lora_dropout_recompute, {})
    return launch_cases(cases, world_size=4, timeout=2400)


@pytest.mark.parametrize("name", list(CASES))
def test_packed_with_feature_matches_single_process_reference(launched, name):
    results = launched[name]
    check_parity([{name: r} for r in results])
    for r in results:
        assert max(r["most_in_a_row"]) > 1, (name, "no row held two samples: nothing was packed")
        got, want = r["eval"]
        assert abs(got - want) <= RTOL * abs(want), (name, r["eval"])
    # sdpa, no packed_attention key: the language ranks' attention modules call sdpa per sample
    held = [r["per_sample_modules"] for r in results if r["per_sample_modules"] is not None]
    assert held and all(held), (name, held)
    for stage, spec in CASES[name]["layout"].items():  # recompute is on where asked, and only there
        held = [r["recomputed"][stage] for r in results if stage in r["recomputed"]]
        assert held and all(h == bool(spec.get("recompute")) for h in held), (name, stage, held)
    if "frozen" in CASES[name]:  # compared on some rank, and bit-identical wherever held
        assert sum(r["frozen_compared"] for r in results) > 0, name
        assert all(r["frozen_identical"] for r in results), name
    if CASES[name].get("model_kw", {}).get("tie_word_embeddings"):
        if "pp" in CASES[name]["layout"]["language"]:  # the head's copy on the last pipeline stage
            copies = [r["tied_copy"] for r in results if r["tied_copy"]]
            assert any(c["shared"] for c in copies), (name, "no rank held the head's copy")
            assert all(c["value"] == copies[0]["value"] for c in copies), name  # every copy equal
        else:  # the head and the embedding stay one parameter
            assert all(r["one_parameter"] for r in results if "one_parameter" in r), name
            assert any("one_parameter" in r for r in results), name
    print(name, measured(results))


@pytest.mark.parametrize("name", list(CONTROLS))
def test_negative_control_misses_the_bar(launched, name):
    for r in launched[name]:
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], r["ref_losses"]))
        assert loss_err > 100 * RTOL or r["weight_err"][0] > 100 * RTOL, (name, loss_err, r["weight_err"])
    print(name, measured(launched[name]))


def test_packed_lora_dropout_recompute_replays_the_forwards_masks(launched):
    for r in launched["lora dropout"]:
        rec, plain, none = r["recompute"], r["plain"], r["no dropout"]
        for key in ("losses", "norms"):
            diff = max(abs(a - b) / abs(b) for a, b in zip(rec[key], plain[key]))
            assert diff <= 1e-6, (key, rec[key], plain[key])
        # the dropout acted: without it the run differs
        assert max(abs(a - b) / abs(b) for a, b in zip(plain["norms"], none["norms"])) > 1e-3, (plain, none)
    r = launched["lora dropout"][0]
    print("lora dropout", [abs(a - b) / abs(b) for a, b in zip(r["recompute"]["losses"], r["plain"]["losses"])])
