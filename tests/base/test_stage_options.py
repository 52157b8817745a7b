"""Per-stage memory options (pure, no processes): `recompute`, `zero_stage`, `freeze` parsed and
refused with the field; each stage's DeepSpeed config; the model checks (freeze patterns,
recompute depth, something left to train); the rank map; the StepPlan of fewer encoder passes
with a sharded language sequence and of an encoder dp above the samples of a pass."""

from __future__ import annotations

import json

import pytest
import torch

from ds_hetero.cli import main, rank_map
from ds_hetero.config import load_config
from ds_hetero.errors import HeteroConfigError
from ds_hetero.validation import check_all, check_engine_support

SEQ = {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}


def _cfg(vision, language, batch=8, micro_batches=2, world=4, **top):
    return load_config({"train_batch_size": batch, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, **top,
                        "hetero_parallel": {"micro_batches": micro_batches,
                                            "stages": {"vision": vision, "language": language}}}, world)


@pytest.fixture(scope="module")
def llava():
    from ds_hetero.toy import tiny_llava

    return tiny_llava("clip")


def test_options_parse_and_reach_each_stage_config():
    cfg = _cfg({"dp": 4, "recompute": 1, "zero_stage": 3, "freeze": ["tower"]}, {"tp": 2, "dp": 2, "recompute": True},
               zero_optimization={"stage": 1, "reduce_bucket_size": 1000})
    v, lang = cfg.options_of("vision"), cfg.options_of("language")
    assert (v.recompute, v.zero_stage, v.freeze) == (1, 3, ("tower",))
    assert (lang.recompute, lang.zero_stage, lang.freeze) == (-1, None, False)
    assert cfg.zero_stage_of("vision") == 3 and cfg.zero_stage_of("language") == 1
    # the stage's ZeRO stage replaces the JSON's; the other ZeRO keys are shared
    assert cfg.stage_ds_config("vision")["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 1000}
    assert cfg.stage_ds_config("language")["zero_optimization"] == {"stage": 1, "reduce_bucket_size": 1000}
    # a stage that trains nothing: no optimizer, no ZeRO
    frozen = cfg.stage_ds_config("vision", trains=False)
    assert "optimizer" not in frozen and frozen["zero_optimization"]["stage"] == 0


@pytest.mark.parametrize("key, value, message", [
    ("recompute", "yes", "false, true"), ("recompute", 0, "positive number"), ("recompute", -2, "positive number"),
    ("zero_stage", 4, "0, 1, 2 or 3"), ("zero_stage", "3", "0, 1, 2 or 3"), ("zero_stage", True, "0, 1, 2 or 3"),
    ("freeze", "tower", "non-empty list"), ("freeze", [], "non-empty list"), ("freeze", [1], "non-empty list"),
])
def test_bad_option_values_name_the_field(key, value, message):
    with pytest.raises(HeteroConfigError) as info:
        _cfg({"dp": 4, key: value}, {"tp": 2, "dp": 2})
    assert info.value.field == f"hetero_parallel.stages.vision.{key}" and message in str(info.value)


@pytest.mark.parametrize("vision, language, top, field, message", [
    ({"dp": 4, "freeze": True}, {"tp": 2, "dp": 2, "freeze": True}, {}, "hetero_parallel.stages.language.freeze",
     "nothing would train"),
    ({"dp": 4, "freeze": True, "zero_stage": 3}, {"tp": 2, "dp": 2}, {}, "hetero_parallel.stages.vision.zero_stage",
     "frozen"),
    ({"dp": 4, "freeze": True, "recompute": True}, {"tp": 2, "dp": 2}, {}, "hetero_parallel.stages.vision.recompute",
     "frozen"),
    ({"dp": 4}, {"tp": 2, "dp": 2, "zero_stage": 0}, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}},
     "hetero_parallel.stages.language.zero_stage", "BF16_Optimizer"),
    ({"dp": 2, "zero_stage": 3, "ranks": [0, 1]}, {"tp": 2, "dp": 1, "ranks": [2, 3]}, {"placement": "disaggregated"},
     "hetero_parallel.stages.vision.zero_stage", "disaggregated"),
    ({"dp": 4}, {"cp": 2, "dp": 2, "zero_stage": 3}, {"zero_optimization": {"stage": 1, "reduce_scatter": False}},
     "zero_optimization.reduce_scatter", "reduce_scatter"),
])
def test_option_combinations_refused_with_the_field(vision, language, top, field, message):
    placement = top.pop("placement", "colocated")
    cfg = load_config({"train_batch_size": 8, "optimizer": {"type": "SGD"}, **top,
                       "hetero_parallel": {"placement": placement, "micro_batches": 2,
                                           "stages": {"vision": vision, "language": language}}}, 4)
    with pytest.raises(HeteroConfigError) as info:
        check_engine_support(cfg)
    assert info.value.field == field and message in str(info.value), str(info.value)


def test_per_stage_zero_3_with_sequence_shards_is_accepted():
    # the encoder at ZeRO 3 while the sequence-sharded language stage runs ZeRO 1, and ZeRO 3 on it
    check_engine_support(_cfg({"dp": 4, "zero_stage": 3}, SEQ, zero_optimization={"stage": 1}))
    check_engine_support(_cfg({"dp": 4}, {"cp": 2, "dp": 2}, zero_optimization={"stage": 3}))
    check_engine_support(_cfg({"dp": 4}, SEQ, zero_optimization={"stage": 3}))


def test_model_checks_freeze_patterns_recompute_depth_and_something_to_train(llava):
    check_all(_cfg({"dp": 4, "freeze": ["tower"]}, {"tp": 2, "dp": 2}), llava)
    check_all(_cfg({"dp": 4, "freeze": ["model.vision_tower.encoder.layers.0.*"]}, {"tp": 2, "dp": 2}), llava)
    with pytest.raises(HeteroConfigError) as info:
        check_all(_cfg({"dp": 4, "freeze": ["tower", "model.vision_tower.nothing.*"]}, {"tp": 2, "dp": 2}), llava)
    assert info.value.field == "hetero_parallel.stages.vision.freeze[1]" and "projector" in str(info.value)
    with pytest.raises(HeteroConfigError) as info:  # layer names of another stage do not match here
        check_all(_cfg({"dp": 4, "freeze": ["lm_head.*"]}, {"tp": 2, "dp": 2}), llava)
    assert info.value.field == "hetero_parallel.stages.vision.freeze[0]"
    with pytest.raises(HeteroConfigError) as info:
        check_all(_cfg({"dp": 4, "recompute": 3}, {"tp": 2, "dp": 2}), llava)
    assert info.value.field == "hetero_parallel.stages.vision.recompute" and "2 transformer layers" in str(info.value)
    # the user's own requires_grad=False on the language model, the config freezing the vision stage
    for p in llava.model.language_model.parameters():
        p.requires_grad_(False)
    llava.lm_head.requires_grad_(False)
    try:
        with pytest.raises(HeteroConfigError, match="nothing would train"):
            check_all(_cfg({"dp": 4, "freeze": True}, {"tp": 2, "dp": 2}), llava)
        check_all(_cfg({"dp": 4, "freeze": ["tower"]}, {"tp": 2, "dp": 2}), llava)  # the projector trains
    finally:
        llava.requires_grad_(True)


def test_validate_shows_and_checks_the_options(tmp_path, capsys):
    cfg = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "optimizer": {"type": "SGD"},
           "hetero_parallel": {"micro_batches": 2, "stages": {
               "vision": {"dp": 4, "freeze": ["tower"], "zero_stage": 3, "recompute": 1},
               "language": {**SEQ, "recompute": True}}}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    assert main(["validate", str(path), "--world-size", "4", "--model", "tiny-llava"]) == 0
    out = capsys.readouterr().out
    assert "recompute 1 layers, frozen: tower" in out and "recompute all" in out, out
    assert rank_map(load_config(cfg, 4)).count("  3  ") >= 1
    cfg["hetero_parallel"]["stages"]["vision"]["freeze"] = ["towr"]
    path.write_text(json.dumps(cfg))
    assert main(["validate", str(path), "--world-size", "4", "--model", "tiny-llava"]) == 1
    assert "hetero_parallel.stages.vision.freeze[0]" in capsys.readouterr().err


def _llava_batch(model, n, seed=0):
    from ds_hetero.testing.batches import llava_samples

    samples = llava_samples(model, n, seed=seed)
    for i, s in enumerate(samples):  # lengths differ: padding differs per micro-batch
        cut = len(s["input_ids"]) - 2 * (i % 3)
        samples[i] = {k: (v[:cut] if k in ("input_ids", "labels") else v) for k, v in s.items()}
    return samples


@pytest.mark.parametrize("language", [SEQ, {"cp": 2, "dp": 2}, {"tp": 2, "dp": 2, "sequence_parallel": True}])
def test_one_encoder_pass_feeding_several_sharded_micro_batches(llava, language):
    from ds_hetero.boundary import build_plan
    from ds_hetero.context_parallel import padded_length
    from ds_hetero.families import adapter_for
    from ds_hetero.step.step_plan import StepPlan

    cfg = _cfg({"dp": 4, "micro_batches": 1}, language, micro_batches=2)  # refused before: one pass, two micro-batches
    samples = _llava_batch(llava, 8)
    plan = StepPlan(cfg, adapter_for(llava).encoders(), samples)
    (p,) = plan.passes["vision"]
    assert p.feeds == range(0, 2)
    # each sample's sequence length is its own micro-batch's padded length, not the pass's
    for i, q in enumerate(p.assignment.samples):
        share = [samples[j] for j in plan.language_samples(p.boundary.dst_dp[i], q // plan.micro_batch_size)]
        assert p.boundary.seq_len[i] == padded_length(max(len(s["input_ids"]) for s in share), cfg.language)
    routes = build_plan(cfg.stages["vision"], cfg.language, p.boundary)
    split = False
    for r in cfg.language.ranks:
        dp = cfg.language.coord(r).dp
        sizes = [plan.rows_of("vision", dp, m, r) for m in p.feeds]
        assert sum(sizes) == routes.for_rank(r).n_out, (r, sizes)
        split |= sizes[0] != plan.rows_of("vision", dp, 0)  # a shard's rows, not the dp share's
    assert split


def test_encoder_dp_above_the_samples_of_a_pass_with_token_balance(llava):
    from ds_hetero.boundary import build_plan
    from ds_hetero.families import adapter_for
    from ds_hetero.step.step_plan import StepPlan

    # 4 samples, 2 passes: 2 samples (of 2 images each) per pass over 4 vision dp ranks
    cfg = _cfg({"dp": 4}, {"tp": 2, "dp": 2}, batch=4, micro_batches=2)
    assert cfg.stage_ds_config("vision")["train_micro_batch_size_per_gpu"] == 1
    samples = _llava_batch(llava, 4)
    for s in samples:
        s["input_ids"] = torch.cat([s["input_ids"], s["input_ids"]])
        s["labels"] = torch.cat([s["labels"], s["labels"]])
        s["pixel_values"] = torch.cat([s["pixel_values"], s["pixel_values"]])
    plan = StepPlan(cfg, adapter_for(llava).encoders(), samples)
    for p in plan.passes["vision"]:
        loads = p.assignment.loads("rows")
        assert all(n > 0 for n in loads), loads  # every vision rank encodes one image
        routes = build_plan(cfg.stages["vision"], cfg.language, p.boundary)
        for r in cfg.stages["vision"].ranks:
            assert routes.for_rank(r).n_in == loads[cfg.stages["vision"].coord(r).dp]
    with pytest.raises(HeteroConfigError, match="balance .tokens"):
        load_config({"train_batch_size": 4, "hetero_parallel": {"micro_batches": 2, "balance": "position", "stages": {
            "vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}}}, 4)
