"""`ds-hetero plan` reads at a glance: its counts add up (every candidate considered is runnable, modelled
only, refused or skipped, once), memory columns hold GB, without --machine it says the CPU figures are nominal
and how to calibrate, and `plan --config` refuses what `ds-hetero validate` refuses."""

from __future__ import annotations

import json
import re

import pytest

from ds_hetero.cli import main
from ds_hetero.planner import machine_profile, plan
from ds_hetero.planner.cli import NOMINAL_NOTE
from ds_hetero.planner.report import _gb, counts_line, ranked_table

PLAN = ["plan", "--model", "tiny-llava", "--world-size", "4", "--seq-len", "256", "--image-tokens", "64",
        "--global-batch", "8", "--top", "5"]


def _adds_up(stats) -> bool:
    return stats["generated"] == stats["runnable"] + stats["modelled"] + stats["rejected"] + stats["pruned"]


@pytest.fixture(scope="module")
def llava_plan():
    return plan("tiny-llava", 4, 256, 64, 8, machine_profile("cpu"))


def test_counts_add_up_with_one_encoder(llava_plan):
    st = llava_plan.stats
    assert _adds_up(st), st
    assert st["runnable"] + st["modelled"] == len(llava_plan.predictions)
    assert st["runnable"] <= st["generated"] and st["pruned"] > 0 and st["modelled"] > 0


def test_counts_add_up_without_the_modelled_search():
    st = plan("tiny-llava", 4, 256, 64, 8, machine_profile("cpu"), modelled=False).stats
    assert _adds_up(st) and st["modelled"] == 0 and st["pruned"] == 0


def test_counts_add_up_with_several_encoders():
    from ds_hetero.toy import tiny_qwen2_5_omni

    base = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {}}}
    st = plan(tiny_qwen2_5_omni(seed=0), 2, 96, None, 8, machine_profile("cpu"), base=base,
              rows={"vision": 16, "audio": 12}).stats
    assert _adds_up(st), st


def test_counts_line_states_every_part(llava_plan):
    st = llava_plan.stats
    line = counts_line(st)
    assert line.startswith(f"{st['generated']} configurations considered: {st['runnable']} runnable")
    assert f"{st['modelled']} modelled only" in line and f"{st['rejected']} refused" in line
    assert f"{st['pruned']} skipped" in line


@pytest.mark.parametrize("nbytes, text", [(7.1e6, "0.0071"), (2.1e8, "0.21"), (12.345e9, "12.35"),
                                          (4.2e4, "0.000042"), (0.0, "0.00")])
def test_memory_is_always_in_gb(nbytes, text):
    assert _gb(nbytes) == text


def test_the_table_has_no_megabytes_in_its_gb_column(llava_plan):
    table = ranked_table(llava_plan, 30)
    assert "peak GB/rank" in table and "peak GB/rank: the most memory one rank holds" in table
    rows = [line for line in table.splitlines() if re.match(r"\s*\d+ (yes|modelled)", line)]
    assert len(rows) == 30
    assert not any(re.search(r"\d+(\.\d+)?M\b", row) for row in rows)  # "0.8M/0.01" was a GB column
    assert not any("e-0" in row for row in rows)


def test_without_machine_the_figures_are_called_nominal(capsys):
    assert main(PLAN) == 0
    out = capsys.readouterr().out
    assert out.startswith(NOMINAL_NOTE) and "--machine calibrate" in NOMINAL_NOTE and "nominal" in NOMINAL_NOTE
    assert main(PLAN + ["--machine", "cpu"]) == 0
    assert NOMINAL_NOTE not in capsys.readouterr().out


@pytest.mark.parametrize("change, field", [
    (lambda ds: ds["hetero_parallel"].update(micro_batchs=2), "hetero_parallel.micro_batchs"),
    (lambda ds: ds["hetero_parallel"]["stages"]["vision"].update(zero_stage=1.5),
     "hetero_parallel.stages.vision.zero_stage"),
    (lambda ds: ds["zero_optimization"].update(stage=1.5), "zero_optimization.stage"),
])
def test_plan_config_refuses_what_validate_refuses(tmp_path, capsys, change, field):
    with open("ds_configs/llava_colocated.json") as f:
        ds = json.load(f)
    change(ds)
    path = tmp_path / "base.json"
    path.write_text(json.dumps(ds))
    assert main(["validate", str(path), "--world-size", "4"]) == 1
    refused = capsys.readouterr().err
    assert f"config error at '{field}'" in refused
    assert main(PLAN + ["--config", str(path), "--no-modelled"]) == 1
    assert capsys.readouterr().err.strip() == "plan: " + refused.strip().removeprefix("invalid: ")


def test_plan_config_takes_a_valid_base_written_for_another_world_size(tmp_path, capsys):
    """The planner replaces the layouts: a base for 4 ranks is checked at the world size it spans."""
    path = tmp_path / "base.json"
    path.write_text(open("ds_configs/llava_colocated.json").read())
    assert main(PLAN[:4] + ["2"] + PLAN[5:] + ["--config", str(path), "--no-modelled"]) == 0


@pytest.mark.parametrize("base", [
    {"zero_optimization": {"stage": 2}},
    {"hetero_parallel": {"language_batching": "packed"}},
    {"hetero_parallel": {"stages": {"vision": {"freeze": True}}}},
])
def test_plan_config_takes_a_base_without_layouts(base):
    from ds_hetero.planner.base_check import check_base

    check_base(base, 4, 8, {"type": "AdamW", "params": {}})


def test_plan_config_checks_the_keys_of_a_base_without_layouts():
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.planner.base_check import check_base

    for base, field in (({"hetero_parallel": {"language_batching": "packd"}}, "hetero_parallel.language_batching"),
                        ({"hetero_parallel": {"stages": {"vision": {"freeze": "yes"}}}}, "stages.vision.freeze")):
        with pytest.raises(HeteroConfigError, match=field):
            check_base(base, 4, 8, {"type": "AdamW", "params": {}})
