"""hetero_parallel config: parsing, per-stage DeepSpeed configs, and every rejection."""

import json

import pytest

from ds_hetero import load_config
from ds_hetero.errors import HeteroConfigError


def ds(stages, batch=16, **section):
    return {"train_batch_size": batch, "hetero_parallel": {"stages": stages, **section}}


COLOCATED = ds({"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}, micro_batches=2)


def test_colocated_layouts_and_stage_configs():
    cfg = load_config(COLOCATED, world_size=4)
    assert cfg.placement == "colocated" and cfg.micro_batches == 2 and cfg.global_batch_size == 16
    assert cfg.stage_names == ("vision", "language")
    assert cfg.stages["vision"].ranks == cfg.stages["language"].ranks == (0, 1, 2, 3)
    v, lang = cfg.stage_ds_config("vision"), cfg.stage_ds_config("language")
    assert (v["train_micro_batch_size_per_gpu"], v["gradient_accumulation_steps"]) == (2, 2)
    assert (lang["train_micro_batch_size_per_gpu"], lang["gradient_accumulation_steps"]) == (4, 2)
    for stage_cfg, dp in ((v, 4), (lang, 2)):
        # DeepSpeed's own consistency rule: train_batch = micro * gas * dp
        assert stage_cfg["train_micro_batch_size_per_gpu"] * stage_cfg["gradient_accumulation_steps"] * dp == 16
        assert "hetero_parallel" not in stage_cfg


def test_stage_config_keeps_deepspeed_keys_and_is_a_copy():
    source = dict(COLOCATED, zero_optimization={"stage": 2}, gradient_clipping=1.0)
    cfg = load_config(source, world_size=4)
    stage_cfg = cfg.stage_ds_config("language")
    assert stage_cfg["zero_optimization"] == {"stage": 2}
    # each engine would clip by its own stage's norm: ds_hetero clips over all stages instead
    assert stage_cfg["gradient_clipping"] == 0.0 and cfg.gradient_clipping == 1.0
    stage_cfg["zero_optimization"]["stage"] = 3
    assert cfg.stage_ds_config("language")["zero_optimization"]["stage"] == 2


def test_clipping_defaults_like_deepspeed():
    assert load_config(COLOCATED, 4).gradient_clipping == 1.0  # DeepSpeed 0.19's default
    assert load_config(dict(COLOCATED, gradient_clipping=0.0), 4).gradient_clipping == 0.0


def test_disaggregated_consecutive_blocks_in_listed_order():
    cfg = load_config(ds({"vision": {"dp": 2}, "language": {"tp": 2, "dp": 1}}, batch=4, placement="disaggregated"), 4)
    assert cfg.stages["vision"].ranks == (0, 1) and cfg.stages["language"].ranks == (2, 3)
    assert cfg.stages_of_rank(0) == ("vision",) and cfg.stages_of_rank(3) == ("language",)


def test_disaggregated_explicit_and_implicit_ranks_mix():
    cfg = load_config(
        ds({"vision": {"dp": 1}, "language": {"dp": 3, "ranks": [0, 2, 3]}}, batch=6, placement="disaggregated"), 4
    )
    assert cfg.stages["vision"].ranks == (1,) and cfg.stages["language"].ranks == (0, 2, 3)


def test_json_and_yaml_files(tmp_path):
    j = tmp_path / "c.json"
    j.write_text(json.dumps(COLOCATED))
    y = tmp_path / "c.yaml"
    y.write_text(
        "train_batch_size: 16\nhetero_parallel:\n  micro_batches: 2\n  stages:\n"
        "    vision: {tp: 1, dp: 4}\n    language: {tp: 2, dp: 2}\n"
    )
    assert load_config(j, 4) == load_config(y, 4) == load_config(COLOCATED, 4)


def test_colocated_explicit_ranks_permute_coordinates():
    cfg = load_config(ds({"vision": {"dp": 4, "ranks": [3, 2, 1, 0]}, "language": L22}), 4)
    assert cfg.stages["vision"].coord(3).dp == 0 and cfg.stages["vision"].coord(0).dp == 3


def test_sequence_parallel_and_cp_reach_the_layout():
    cfg = load_config(ds({"vision": {"dp": 4}, "language": {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}}, batch=4), 4)
    lang = cfg.stages["language"]
    assert (lang.tp, lang.cp, lang.dp, lang.sequence_parallel) == (2, 2, 1, True)


def test_batch_keys_that_agree_or_are_auto_are_accepted():
    load_config(dict(COLOCATED, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2), 4)
    load_config(dict(COLOCATED, train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps="auto"), 4)


V4 = {"tp": 1, "dp": 4}
L22 = {"tp": 2, "dp": 2}

# (case id, DeepSpeed config, world size, field named in the error, words the message must contain)
INVALID = [
    ("no_section", {"train_batch_size": 8}, 4, "hetero_parallel", "missing"),
    ("section_not_mapping", {"train_batch_size": 8, "hetero_parallel": [1]}, 4, "hetero_parallel", "mapping"),
    ("unknown_section_key", dict(ds({"vision": V4, "language": L22}), hetero_parallel={"stages": {"vision": V4, "language": L22}, "microbatches": 2}), 4, "hetero_parallel.microbatches", "valid keys"),
    ("bad_placement", ds({"vision": V4, "language": L22}, placement="spread"), 4, "hetero_parallel.placement", "colocated, disaggregated, mixed or first_stage"),
    ("micro_batches_zero", ds({"vision": V4, "language": L22}, micro_batches=0), 4, "hetero_parallel.micro_batches", "positive"),
    ("micro_batches_str", ds({"vision": V4, "language": L22}, micro_batches="2"), 4, "hetero_parallel.micro_batches", "positive integer"),
    ("no_batch", {"hetero_parallel": {"stages": {"vision": V4, "language": L22}}}, 4, "train_batch_size", "global batch"),
    ("batch_float", ds({"vision": V4, "language": L22}, batch=8.0), 4, "train_batch_size", "positive integer"),
    ("no_stages", {"train_batch_size": 8, "hetero_parallel": {}}, 4, "hetero_parallel.stages", "missing"),
    ("empty_stages", ds({}), 4, "hetero_parallel.stages", "non-empty"),
    ("unknown_stage", ds({"vision": V4, "langauge": L22}), 4, "hetero_parallel.stages.langauge", "valid names"),
    ("missing_language", ds({"vision": V4, "audio": V4}), 4, "hetero_parallel.stages.language", "missing"),
    ("language_only", ds({"language": L22}), 4, "hetero_parallel.stages", "encoder"),
    ("stage_not_mapping", ds({"vision": 4, "language": L22}), 4, "hetero_parallel.stages.vision", "mapping"),
    ("unknown_stage_key", ds({"vision": {"dp": 4, "xp": 1}, "language": L22}), 4, "hetero_parallel.stages.vision.xp", "valid keys"),
    ("missing_dp", ds({"vision": {"tp": 4}, "language": L22}), 4, "hetero_parallel.stages.vision.dp", "missing"),
    ("tp_zero", ds({"vision": {"tp": 0, "dp": 4}, "language": L22}), 4, "hetero_parallel.stages.vision.tp", "positive"),
    ("dp_negative", ds({"vision": {"dp": -4}, "language": L22}), 4, "hetero_parallel.stages.vision.dp", "positive"),
    ("tp_bool", ds({"vision": {"tp": True, "dp": 4}, "language": L22}), 4, "hetero_parallel.stages.vision.tp", "bool"),
    ("tp_string", ds({"vision": V4, "language": {"tp": "2", "dp": 2}}), 4, "hetero_parallel.stages.language.tp", "str"),
    ("vision_cp", ds({"vision": {"cp": 2, "dp": 2}, "language": L22}), 4, "hetero_parallel.stages.vision.cp", "language sequence only"),
    ("vision_sp", ds({"vision": {"tp": 2, "dp": 2, "sequence_parallel": True}, "language": L22}), 4, "hetero_parallel.stages.vision.sequence_parallel", "language stage only"),
    ("sp_without_tp", ds({"vision": V4, "language": {"dp": 4, "sequence_parallel": True}}), 4, "hetero_parallel.stages.language.sequence_parallel", "tp > 1"),
    ("sp_not_bool", ds({"vision": V4, "language": {"tp": 2, "dp": 2, "sequence_parallel": "yes"}}), 4, "hetero_parallel.stages.language.sequence_parallel", "true or false"),
    ("colocated_product", ds({"vision": V4, "language": {"tp": 2, "dp": 1}}), 4, "hetero_parallel.stages.language", "product is 4"),
    ("world_mismatch", ds({"vision": V4, "language": L22}), 8, "hetero_parallel.stages.vision", "spans all 8 ranks"),
    ("colocated_rank_subset", ds({"vision": {"dp": 4, "ranks": [0, 1, 2, 4]}, "language": L22}), 5, "hetero_parallel.stages.vision", "product is 5"),
    ("colocated_different_ranks", ds({"vision": {"dp": 2, "ranks": [0, 1]}, "language": {"dp": 2, "ranks": [2, 3]}}, batch=4), 4, "hetero_parallel.stages.vision", "need placement \"disaggregated\""),
    ("duplicate_rank", ds({"vision": {"dp": 2, "ranks": [0, 0]}, "language": {"dp": 2}}, placement="disaggregated"), 4, "hetero_parallel.stages.vision.ranks", "listed twice"),
    ("out_of_range_rank", ds({"vision": {"dp": 2, "ranks": [0, 4]}, "language": {"dp": 2}}, placement="disaggregated"), 4, "hetero_parallel.stages.vision.ranks", "outside the world"),
    ("negative_rank", ds({"vision": {"dp": 2, "ranks": [-1, 0]}, "language": {"dp": 2}}, placement="disaggregated"), 4, "hetero_parallel.stages.vision.ranks", "outside the world"),
    ("ranks_not_list", ds({"vision": {"dp": 2, "ranks": "0,1"}, "language": {"dp": 2}}, placement="disaggregated"), 4, "hetero_parallel.stages.vision.ranks", "list of global ranks"),
    ("ranks_len_mismatch", ds({"vision": {"dp": 2, "ranks": [0, 1, 2]}, "language": {"dp": 1}}, placement="disaggregated"), 4, "hetero_parallel.stages.vision.ranks", "lists 3 ranks"),
    ("partly_overlapping", ds({"vision": {"dp": 2, "ranks": [0, 1]}, "language": {"dp": 2, "ranks": [1, 2]}}, placement="disaggregated"), 4, "hetero_parallel.stages.language.ranks", "shares ranks [1]"),
    ("identical_disaggregated", ds({"vision": {"dp": 2, "ranks": [0, 1]}, "language": {"dp": 2, "ranks": [0, 1]}}, placement="disaggregated"), 4, "hetero_parallel.stages.language.ranks", "disjoint"),
    ("disaggregated_too_many", ds({"vision": {"dp": 2}, "language": {"tp": 2, "dp": 2}}, placement="disaggregated"), 4, "hetero_parallel.stages", "need 6 ranks"),
    ("disaggregated_idle_ranks", ds({"vision": {"dp": 1}, "language": {"dp": 2}}, batch=2, placement="disaggregated"), 4, "hetero_parallel.stages", "add up to 4"),
    # with balance "tokens" an encoder takes any dp (images are its unit); by position it needs whole samples
    ("batch_not_divisible", ds({"vision": V4, "language": L22}, batch=6, balance="position"), 4, "train_batch_size", "dp x micro_batches = 4 x 1"),
    ("batch_not_divisible_micro", ds({"vision": {"dp": 1}, "language": {"tp": 1, "dp": 1}}, batch=3, micro_batches=2), 1, "train_batch_size", "multiple of 2"),
    ("conflicting_micro_batch_key", dict(COLOCATED, train_micro_batch_size_per_gpu=2), 4, "train_micro_batch_size_per_gpu", "remove it"),
    ("conflicting_gas_key", dict(COLOCATED, gradient_accumulation_steps=4), 4, "gradient_accumulation_steps", "derives it"),
    ("world_size_zero", COLOCATED, 0, "world_size", "positive"),
    ("timeout_zero", ds({"vision": V4, "language": L22}, timeout_s=0), 4, "hetero_parallel.timeout_s", "positive number"),
    ("timeout_infinite", ds({"vision": V4, "language": L22}, timeout_s=float("inf")), 4, "hetero_parallel.timeout_s", "up to"),
    ("timeout_huge", ds({"vision": V4, "language": L22}, timeout_s=1e300), 4, "hetero_parallel.timeout_s", "up to"),
    ("timeout_nan", ds({"vision": V4, "language": L22}, timeout_s=float("nan")), 4, "hetero_parallel.timeout_s", "positive number"),
    ("clipping_string", dict(COLOCATED, gradient_clipping="abc"), 4, "gradient_clipping", "finite number >= 0"),
    ("clipping_nan", dict(COLOCATED, gradient_clipping=float("nan")), 4, "gradient_clipping", "finite number >= 0"),
    ("clipping_negative", dict(COLOCATED, gradient_clipping=-1), 4, "gradient_clipping", "finite number >= 0"),
    ("clipping_infinite", dict(COLOCATED, gradient_clipping=float("inf")), 4, "gradient_clipping", "finite number >= 0"),
    ("clipping_bool", dict(COLOCATED, gradient_clipping=True), 4, "gradient_clipping", "finite number >= 0"),
]


@pytest.mark.parametrize("source,world,field,words", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_config_names_the_field_and_the_fix(source, world, field, words):
    with pytest.raises(HeteroConfigError) as info:
        load_config(source, world_size=world)
    assert info.value.field == field
    assert words in str(info.value), str(info.value)


def test_at_least_twenty_distinct_rejections():
    assert len({c[0] for c in INVALID}) >= 20


def test_file_errors(tmp_path):
    with pytest.raises(HeteroConfigError, match="does not exist"):
        load_config(tmp_path / "nope.json", 4)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(HeteroConfigError, match=r"bad.json: line 1, column 2: invalid JSON"):
        load_config(bad, 4)
    directory = tmp_path / "configs"
    directory.mkdir()
    with pytest.raises(HeteroConfigError, match="is a directory"):
        load_config(directory, 4)


def test_yaml_suffix_in_any_case_and_json_nan_reach_the_checks(tmp_path):
    yaml_text = "train_batch_size: 16\nhetero_parallel:\n  stages:\n    vision: {dp: 4}\n    language: {tp: 2, dp: 2}\n"
    upper = tmp_path / "c.YAML"
    upper.write_text(yaml_text)
    assert load_config(upper, 4).global_batch_size == 16  # parsed as YAML, not as JSON
    # JSON's NaN / Infinity literals (Python's json reads them) are refused, naming the field
    stages = '"stages": {"vision": {"dp": 4}, "language": {"dp": 4}}'
    for text, field in (
        ('{"train_batch_size": 16, "gradient_clipping": NaN, "hetero_parallel": {%s}}' % stages, "gradient_clipping"),
        ('{"train_batch_size": 16, "hetero_parallel": {"timeout_s": Infinity, %s}}' % stages, "hetero_parallel.timeout_s"),
    ):
        path = tmp_path / "c.json"
        path.write_text(text)
        with pytest.raises(HeteroConfigError) as info:
            load_config(path, 4)
        assert info.value.field == field, str(info.value)
