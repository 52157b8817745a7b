"""Config errors name what binds and where: the stage whose divisor refuses a batch (never suggesting a setting
already in force), a syntax error's file, line and column, a Trainer-only "auto" as such (an optimizer "auto" alone
too, where the JSON is read as written)."""

from __future__ import annotations

import json

import pytest

from ds_hetero.config import load_config, read_ds_config
from ds_hetero.config.trainer_only import refuse_trainer_auto
from ds_hetero.errors import ConfigFileError, HeteroConfigError

MAIN = "ds_configs/llava_colocated.json"  # vision tp1 dp4, language tp2 dp2, micro_batches 2, balance tokens


def _error(ds, world=4) -> str:
    with pytest.raises(HeteroConfigError) as info:
        load_config(ds, world)
    return str(info.value)


def _main(**changes):
    ds = read_ds_config(MAIN)
    ds.update(changes)
    return ds


@pytest.mark.parametrize("batch", [15, 14, 6])
def test_batch_error_names_the_language_stage_when_it_binds(batch):
    text = _error(_main(train_batch_size=batch))
    assert "stage 'language' dp x micro_batches = 2 x 2 = 4" in text and "use a multiple of 4" in text
    assert "vision" not in text and "balance" not in text  # balance "tokens" is already in force


def test_the_multiple_the_error_offers_validates():
    text = _error(_main(train_batch_size=15))
    assert "(e.g. 12 or 16)" in text
    for batch in (12, 16):
        load_config(_main(train_batch_size=batch), 4)


def test_position_balanced_encoder_binds_and_is_offered_tokens():
    ds = _main(train_batch_size=12)
    ds["hetero_parallel"]["balance"] = "position"
    text = _error(ds)
    assert "stage 'vision' dp x micro_batches = 4 x 2 = 8; use a multiple of 8 (e.g. 8 or 16)" in text
    assert 'or balance "tokens" for stage \'vision\'' in text


def test_least_common_multiple_when_stages_disagree():
    ds = _main(train_batch_size=16)  # language 2 x 2 = 4 divides 16; vision by position 3 x 2 = 6 does not
    ds["hetero_parallel"].update(balance="position", placement="disaggregated")
    ds["hetero_parallel"]["stages"] = {"vision": {"dp": 3}, "language": {"tp": 1, "dp": 2}}
    text = _error(ds, world=5)
    assert "stage 'vision' dp x micro_batches = 3 x 2 = 6; use a multiple of 12 (e.g. 12 or 24)" in text
    assert "vision 6, language 4" in text


def test_json_syntax_error_says_file_line_and_column(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "train_batch_size": 16,\n  "hetero_parallel": {"stages": {"vision": {"dp": 4} "x": 1}}\n}\n')
    with pytest.raises(ConfigFileError) as info:
        load_config(path, 4)
    text = str(info.value)
    assert text == f"config file {path}: line 3, column 54: invalid JSON: Expecting ',' delimiter"
    assert "hetero_parallel config error" not in text and info.value.field == "config"


def test_yaml_syntax_error_says_line_and_column(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(ConfigFileError, match=r"broken.yaml: line 3, column 2: invalid YAML"):
        load_config(path, 4)


def test_trainer_only_auto_is_named_and_points_to_the_launcher_configs():
    text = _error(read_ds_config("ds_configs/trainer_colocated_packed.json"))
    assert text.startswith("hetero_parallel config error at 'gradient_clipping': \"auto\" is a Trainer-only value")
    assert "train_batch_size, gradient_clipping, optimizer.params.lr" in text
    assert "ds_configs/llava_*.json" in text and "ds_configs/llava_packed.json" in text
    assert "train_micro_batch_size_per_gpu" not in text.split("has \"auto\" at")[1].split(".")[0]


def test_launcher_packed_config_is_the_trainer_one_with_numbers():
    launcher = read_ds_config("ds_configs/llava_packed.json")
    trainer = read_ds_config("ds_configs/trainer_colocated_packed.json")
    assert launcher["hetero_parallel"] == trainer["hetero_parallel"]
    assert "auto" not in json.dumps(launcher)
    cfg = load_config(launcher, 4)
    assert cfg.packed


def _optimizer_auto():
    """The main config with numbers for the batch and clipping, "auto" only in the optimizer (and a derived key)."""
    ds = _main(train_micro_batch_size_per_gpu="auto")
    ds["optimizer"] = {**ds["optimizer"], "params": {**ds["optimizer"]["params"], "lr": "auto", "betas": "auto"}}
    return ds


def test_an_optimizer_auto_alone_is_named_as_trainer_only_where_the_json_is_read_as_written():
    with pytest.raises(HeteroConfigError) as info:
        refuse_trainer_auto(_optimizer_auto(), as_written=True)
    text = str(info.value)
    assert text.startswith("hetero_parallel config error at 'optimizer.params.lr': \"auto\" is a Trainer-only value")
    assert 'has "auto" at optimizer.params.lr, optimizer.params.betas. ' in text  # the derived key not among them
    assert "ds_configs/llava_colocated.json" in text


def test_a_scheduler_auto_alone_is_named_too():
    ds = _main(scheduler={"type": "WarmupLR", "params": {"warmup_max_lr": "auto", "warmup_num_steps": 10}})
    with pytest.raises(HeteroConfigError, match="at 'scheduler.params.warmup_max_lr': \"auto\" is a Trainer-only"):
        refuse_trainer_auto(ds, as_written=True)


def test_negative_control_numbers_in_the_optimizer_pass_as_written():
    refuse_trainer_auto(_main(train_micro_batch_size_per_gpu="auto"), as_written=True)


def test_initialize_refuses_an_optimizer_auto_before_building_anything():
    """The launcher recipe's and Accelerate's path (initialize); before today DeepSpeed stopped at lr="auto"."""
    import torch

    from ds_hetero.entry import prepare_config

    with pytest.raises(HeteroConfigError, match="at 'optimizer.params.lr': \"auto\" is a Trainer-only value"):
        prepare_config(torch.nn.Linear(1, 1), _optimizer_auto())


def test_parse_scope_leaves_the_optimizer_auto_to_the_trainer():
    """`ds-hetero validate` and the planner check a Trainer JSON (batch and clipping filled as the Trainer would);
    the optimizer's "auto" is the Trainer's to fill, so parse_config takes it."""
    assert load_config(_optimizer_auto(), 4).global_batch_size == 16
