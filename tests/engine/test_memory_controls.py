"""Per-stage memory controls against a single-process Hugging Face reference: frozen modules,
ZeRO stage per stage, activation recompute.

Frozen: the config's `freeze` (LLaVA's tower, Qwen2-VL's tower; the whole language stage with
only the projector training, LLaVA's pretraining recipe) and the user's own
`requires_grad_(False)` (the whole vision stage): the trained weights match a reference that
freezes the same parameters (1e-5 relative), the frozen ones are bit-identical to their initial
values, a stage with nothing to train has no optimizer parameter, and a frozen encoder stage
sends no byte in the boundary's backward (the trainable runs do: the negative control).

ZeRO per stage: vision ZeRO 3 over dp4 with language ZeRO 1 (plain, and with cp2 + sequence
parallelism on the language stage), and the reverse, at the same parity bar. ZeRO 3 on the
sequence-sharded language stage (cp2, cp2 + sp, sp): at the bar; without either of the two
corrections of context_parallel/zero3.py (DeepSpeed 0.19's own behaviour) the weights differ.

Fewer encoder passes than language micro-batches with the sequence sharded (cp, sp), and an
encoder dp above the samples of a pass (balance tokens): at the bar.

Recompute: with attention dropout on, losses and weights with recompute equal those without
(1e-6) on LLaVA (tp2 dp2, and cp2 + sp on the language stage); turning off torch's RNG
preservation makes them differ (the negative control: dropout draws are what is checked);
without dropout, recompute matches the single-process reference on LLaVA and Qwen2-VL.
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from ds_hetero.testing.parity import train_both
from tests.helpers.memory_parity import CLIP, check_parity, freeze_names, frozen_report, max_diff, train_plain

pytestmark = pytest.mark.distributed

TOWER = ["model.vision_tower."]
QWEN_TOWER = ["model.visual.patch_embed.", "model.visual.blocks."]
VISION = ["model.vision_tower.", "model.multi_modal_projector."]
LANGUAGE = ["model.language_model.", "lm_head."]
SEQ = {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}
TP2DP2 = {"tp": 2, "dp": 2}


def _frozen_suite(rank, world_size):
    runs = {
        "tower frozen by config": dict(
            layout={"vision": {"tp": 1, "dp": 4, "freeze": ["tower"]}, "language": TP2DP2}, zero_stage=1,
            freeze_reference=lambda m: freeze_names(m, TOWER), after=frozen_report(TOWER)),
        "vision frozen by requires_grad (user), language zero 2": dict(
            layout={"vision": {"tp": 1, "dp": 4}, "language": TP2DP2}, zero_stage=2,
            prepare=lambda m: freeze_names(m, VISION), after=frozen_report(VISION)),
        "projector only (tower and language frozen by config), vision zero 3": dict(
            layout={"vision": {"tp": 2, "dp": 2, "freeze": ["tower"], "zero_stage": 3},
                    "language": {"tp": 2, "dp": 2, "freeze": True}}, zero_stage=1, optimizer="sgd",
            freeze_reference=lambda m: freeze_names(m, TOWER + LANGUAGE), after=frozen_report(TOWER + LANGUAGE)),
        "vision frozen by config, language cp2 sp": dict(
            layout={"vision": {"tp": 1, "dp": 4, "freeze": True}, "language": SEQ}, zero_stage=1,
            freeze_reference=lambda m: freeze_names(m, VISION), after=frozen_report(VISION)),
        "vision frozen by config, disaggregated": dict(
            layout={"vision": {"tp": 1, "dp": 2, "ranks": [0, 1], "freeze": True},
                    "language": {"tp": 2, "dp": 1, "ranks": [2, 3]}}, placement="disaggregated", zero_stage=1,
            freeze_reference=lambda m: freeze_names(m, VISION), after=frozen_report(VISION)),
        # the same layout as the frozen vision above: its backward exchange moves rows (with the
        # sequence sharded every language rank needs rows of every vision rank)
        "trainable (control)": dict(
            layout={"vision": {"tp": 1, "dp": 4}, "language": SEQ}, zero_stage=1, after=frozen_report([])),
    }
    return {name: train_both(rank, world_size, "llava", **{"steps": 3, "clip": CLIP, **kw})
            for name, kw in runs.items()}


def _zero_suite(rank, world_size):
    runs = {
        "vision zero 3 dp4 + language zero 1": dict(
            layout={"vision": {"tp": 1, "dp": 4, "zero_stage": 3}, "language": TP2DP2}, zero_stage=1, optimizer="sgd"),
        "vision zero 3 dp4 + language zero 1 cp2 sp": dict(
            layout={"vision": {"tp": 1, "dp": 4, "zero_stage": 3}, "language": SEQ}, zero_stage=1),
        "vision zero 0 + language zero 3 tp2dp2": dict(
            layout={"vision": {"tp": 1, "dp": 4, "zero_stage": 0}, "language": TP2DP2}, zero_stage=3,
            optimizer="sgd"),
    }
    out = {name: train_both(rank, world_size, "llava", **{"steps": 3, "clip": CLIP, **kw})
           for name, kw in runs.items()}
    # the engines really run the stage's ZeRO stage
    out["engines"] = _zero_stages(rank)
    return out


ZERO3_CP = {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 1, "cp": 2, "dp": 2}}


def _zero3_sequence_suite(rank, world_size):
    """ZeRO 3 on the sequence-sharded language stage (context_parallel/zero3.py), and each of its two
    corrections taken out (negative controls: DeepSpeed's own behaviour)."""
    import ds_hetero.stages.build as build

    runs = {
        "zero 3 language cp2 dp2 sgd": dict(layout=ZERO3_CP, zero_stage=3, optimizer="sgd"),
        "zero 3 language tp2 cp2 sp adamw": dict(layout={"vision": {"tp": 1, "dp": 4}, "language": SEQ},
                                                 zero_stage=3),
        "zero 3 language tp2 dp2 sp sgd, vision zero 1": dict(
            layout={"vision": {"tp": 1, "dp": 4, "zero_stage": 1},
                    "language": {"tp": 2, "dp": 2, "sequence_parallel": True}}, zero_stage=3, optimizer="sgd"),
    }
    out = {name: train_both(rank, world_size, "llava", **{"steps": 3, "clip": CLIP, **kw})
           for name, kw in runs.items()}
    controls = {}
    for fix in ("correct_sequence_average", "partition_over_sequence_shards"):
        right = getattr(build, fix)
        setattr(build, fix, lambda *args, **kwargs: False)
        try:
            r = train_both(rank, world_size, "llava", ZERO3_CP, 3, 2, CLIP, optimizer="sgd")
        finally:
            setattr(build, fix, right)
        controls[fix] = r["weight_err"]
    return out, controls


def _sharded_passes_suite(rank, world_size):
    runs = {
        "llava one vision pass, language tp2 cp2 sp": ("llava", dict(
            layout={"vision": {"tp": 1, "dp": 4, "micro_batches": 1}, "language": SEQ}, zero_stage=1)),
        "llava 2 vision passes for 4 micro-batches, language cp2 dp2": ("llava", dict(
            layout={"vision": {"tp": 1, "dp": 4, "micro_batches": 2}, "language": {"cp": 2, "dp": 2}},
            micro_batches=4, zero_stage=2)),
        "qwen2-vl one vision pass, language tp2 dp2 sp": ("qwen2_vl", dict(
            layout={"vision": {"tp": 1, "dp": 4, "micro_batches": 1},
                    "language": {"tp": 2, "dp": 2, "sequence_parallel": True}}, zero_stage=1)),
        "llava vision dp4 over 2 samples a pass (balance tokens)": ("llava", dict(
            layout={"vision": {"tp": 1, "dp": 4}, "language": TP2DP2}, batch_size=4, zero_stage=1)),
    }
    return {name: train_both(rank, world_size, family, **{"steps": 3, "clip": CLIP, **kw})
            for name, (family, kw) in runs.items()}


def _zero_stages(rank):
    import torch

    import ds_hetero
    from ds_hetero.testing.parity import build_model

    config = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
              "hetero_parallel": {"micro_batches": 2, "stages": {"vision": {"tp": 1, "dp": 4, "zero_stage": 3},
                                                                 "language": {"tp": 2, "dp": 2, "zero_stage": 2}}}}
    engine = ds_hetero.initialize(build_model("llava", 7), config, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    got = {name: e.zero_optimization_stage() for name, e in engine.engines.items()}
    engine.groups.destroy()
    return got


def _recompute_suite(rank, world_size):
    import ds_hetero.stages.build as build

    out = {}
    for label, language in (("tp2dp2", TP2DP2), ("cp2 sp", SEQ)):
        base = {"vision": {"tp": 1, "dp": 4}, "language": language}
        with_rc = {"vision": {"tp": 1, "dp": 4, "recompute": True}, "language": {**language, "recompute": 1}}
        plain = train_plain("llava", base, 3, dropout=0.2)
        rc = train_plain("llava", with_rc, 3, dropout=0.2)
        # negative control: the same recompute without torch's RNG preservation
        right = build.enable_recompute
        build.enable_recompute = lambda module, layers, **kw: right(module, layers, preserve_rng_state=False, **kw)
        try:
            wrong = train_plain("llava", with_rc, 3, dropout=0.2)
        finally:
            build.enable_recompute = right
        out[label] = {"recompute": max_diff(rc, plain), "no rng preservation": max_diff(wrong, plain)}
    return out


def _recompute_reference_suite(rank, world_size):
    runs = {
        "llava recompute both stages tp2dp2": ("llava", dict(
            layout={"vision": {"tp": 2, "dp": 2, "recompute": True}, "language": {**TP2DP2, "recompute": True}},
            zero_stage=2)),
        "qwen2-vl recompute both stages, language cp2 sp": ("qwen2_vl", dict(
            layout={"vision": {"tp": 1, "dp": 4, "recompute": True}, "language": {**SEQ, "recompute": True}},
            zero_stage=1)),
        "qwen2-vl tower frozen, recompute language": ("qwen2_vl", dict(
            layout={"vision": {"tp": 1, "dp": 4, "freeze": ["tower"]}, "language": {**TP2DP2, "recompute": 1}},
            zero_stage=1, freeze_reference=lambda m: freeze_names(m, QWEN_TOWER), after=frozen_report(QWEN_TOWER))),
    }
    return {name: train_both(rank, world_size, family, **{"steps": 3, "clip": CLIP, **kw})
            for name, (family, kw) in runs.items()}


@pytest.fixture(scope="module")
def launched():
    """Every distributed check of this module in one 4-rank launch: {case: [its result on each rank]}."""
    cases = {"frozen": (_frozen_suite, {}), "zero": (_zero_suite, {}), "zero3_sequence": (_zero3_sequence_suite, {}),
             "sharded_passes": (_sharded_passes_suite, {}), "recompute": (_recompute_suite, {}),
             "recompute_reference": (_recompute_reference_suite, {})}
    return launch_cases(cases, world_size=4, timeout=3000)


def test_frozen_modules_match_reference_and_stay_bit_identical(launched):
    results = launched["frozen"]
    check_parity(results)
    # bytes all ranks sent in backward exchanges, per step (a rank may keep its rows local)
    total = {name: [sum(r[name]["backward_bytes"][i] for r in results) for i in range(3)] for name in results[0]}
    assert all(b > 0 for b in total["trainable (control)"]), total
    for name in results[0]:
        # disaggregated: a rank compares the stages it holds only; all ranks together compare all
        assert sum(r[name]["trained_changed"] for r in results) > 0, name
        if name != "trainable (control)":
            assert sum(r[name]["frozen_compared"] for r in results) > 0, name
            assert all(r[name]["frozen_identical"] for r in results), name
    for per_rank in results:
        user = per_rank["vision frozen by requires_grad (user), language zero 2"]
        assert user["trains"] == {"vision": False, "language": True}
        assert user["optimizer_params"]["vision"] == 0 and user["backward_bytes"] == [0, 0, 0]
        assert per_rank["vision frozen by config, language cp2 sp"]["backward_bytes"] == [0, 0, 0]
        assert per_rank["vision frozen by config, disaggregated"]["backward_bytes"] == [0, 0, 0]
        projector = per_rank["projector only (tower and language frozen by config), vision zero 3"]
        assert projector["trains"] == {"vision": True, "language": False}
        assert projector["optimizer_params"]["language"] == 0


def test_zero_stage_per_stage_matches_reference(launched):
    results = launched["zero"]
    engines = [r.pop("engines") for r in results]
    assert all(e == {"vision": 3, "language": 2} for e in engines), engines
    check_parity(results)


def test_zero3_with_sequence_shards_matches_reference_and_needs_both_corrections(launched):
    results = launched["zero3_sequence"]
    check_parity([r for r, _ in results])
    for _, controls in results:
        for fix, (err, where, abs_err, compared) in controls.items():
            assert compared > 0 and err > 100 * 1e-5, (fix, err, where)


def test_fewer_encoder_passes_with_sharded_sequence_match_reference(launched):
    check_parity(launched["sharded_passes"])


def test_recompute_equals_no_recompute_with_dropout(launched):
    results = launched["recompute"]
    for per_rank in results:
        for label, r in per_rank.items():
            loss, weight = r["recompute"]
            assert loss <= 1e-6 and weight <= 1e-6, (label, r)
            loss, weight = r["no rng preservation"]
            assert loss > 1e-4 or weight > 1e-4, (label, "the negative control did not move", r)


def test_recompute_matches_reference_llava_and_qwen2_vl(launched):
    check_parity(launched["recompute_reference"])
