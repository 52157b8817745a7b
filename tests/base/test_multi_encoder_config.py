"""Several encoder stages in the config: placement "mixed", per-stage balance and micro-batches,
and every rejection (pure: no processes)."""

import pytest

from ds_hetero.boundary.inputs import check_placement
from ds_hetero.config import load_config
from ds_hetero.errors import HeteroConfigError
from ds_hetero.validation import check_engine_support


def ds(stages, batch=8, **section):
    return {"train_batch_size": batch, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "hetero_parallel": {"micro_batches": 2, "stages": stages, **section}}


MIXED = {"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 2, "ranks": [2, 3]},
         "language": {"tp": 2, "dp": 1, "ranks": [0, 1]}}


def test_mixed_placement_colocates_one_encoder_and_puts_the_other_apart():
    cfg = load_config(ds(MIXED, placement="mixed"), 4)
    assert cfg.stages["vision"].ranks == cfg.stages["language"].ranks == (0, 1)
    assert cfg.stages["audio"].ranks == (2, 3)
    assert check_placement(cfg.stages["vision"], cfg.language, "mixed") == "colocated"
    assert check_placement(cfg.stages["audio"], cfg.language, "mixed") == "disaggregated"
    assert cfg.stages_of_rank(0) == ("vision", "language") and cfg.stages_of_rank(3) == ("audio",)


def test_mixed_stage_spanning_the_world_needs_no_ranks():
    stages = {"vision": {"dp": 4}, "audio": {"dp": 4}, "language": {"tp": 2, "dp": 2}}
    cfg = load_config(ds(stages, placement="mixed"), 4)
    assert all(layout.ranks == (0, 1, 2, 3) for layout in cfg.stages.values())


@pytest.mark.parametrize("stages, field, words", [
    # audio on [1, 2] partly overlaps the language ranks [0, 1]
    ({"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 2, "ranks": [1, 2]},
      "language": {"dp": 2, "ranks": [0, 1]}}, "hetero_parallel.stages.audio.ranks", "partly overlaps"),
    # encoders partly overlapping each other are refused too
    ({"vision": {"dp": 2, "ranks": [2, 3]}, "audio": {"dp": 1, "ranks": [3]},
      "language": {"dp": 2, "ranks": [0, 1]}}, "hetero_parallel.stages.audio.ranks", "partly overlaps"),
    ({"vision": {"dp": 2}, "audio": {"dp": 2, "ranks": [2, 3]}, "language": {"dp": 2, "ranks": [0, 1]}},
     "hetero_parallel.stages.vision.ranks", "missing"),
    ({"vision": {"dp": 1, "ranks": [0]}, "audio": {"dp": 1, "ranks": [2]}, "language": {"dp": 1, "ranks": [0]}},
     "hetero_parallel.stages", "hold no stage"),
])
def test_mixed_placement_rejections(stages, field, words):
    with pytest.raises(HeteroConfigError) as info:
        load_config(ds(stages, placement="mixed"), 4)
    assert info.value.field == field and words in str(info.value)


def test_mixed_refuses_fewer_encoder_passes_and_zero3():
    stages = {**MIXED, "audio": {**MIXED["audio"], "micro_batches": 1}}
    with pytest.raises(HeteroConfigError) as info:
        load_config(ds(stages, placement="mixed"), 4)
    assert info.value.field == "hetero_parallel.stages.audio.micro_batches"
    cfg = load_config({**ds(MIXED, placement="mixed"), "zero_optimization": {"stage": 3}}, 4)
    with pytest.raises(HeteroConfigError, match="mixed"):
        check_engine_support(cfg)


def test_per_stage_balance_and_micro_batches():
    stages = {"vision": {"dp": 4, "balance": "position", "micro_batches": 1}, "audio": {"tp": 2, "dp": 2},
              "language": {"tp": 2, "dp": 2}}
    cfg = load_config(ds(stages, balance="tokens"), 4)
    assert cfg.balance_of("vision") == "position" and cfg.balance_of("audio") == "tokens"
    assert cfg.micro_batches_of("vision") == 1 and cfg.micro_batches_of("audio") == 2
    for bad, field in (({"balance": "random"}, "vision"), ):
        with pytest.raises(HeteroConfigError) as info:
            load_config(ds({**stages, "vision": {"dp": 4, **bad}}), 4)
        assert info.value.field == f"hetero_parallel.stages.{field}.balance"
    with pytest.raises(HeteroConfigError) as info:
        load_config(ds({**stages, "language": {"tp": 2, "dp": 2, "balance": "tokens"}}), 4)
    assert info.value.field == "hetero_parallel.stages.language.balance"


def test_a_partial_overlap_has_no_boundary_plan():
    cfg = load_config(ds(MIXED, placement="mixed"), 4)
    vision = cfg.stages["vision"]
    from dataclasses import replace

    with pytest.raises(HeteroConfigError, match="partly overlap"):
        check_placement(replace(vision, ranks=(1, 2)), cfg.language, "mixed")
    with pytest.raises(HeteroConfigError, match="colocated"):
        check_placement(cfg.stages["audio"], cfg.language, "colocated")
