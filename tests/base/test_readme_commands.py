"""Every README command runs as written from a fresh shell (`env -i`, PATH=/usr/bin:/bin, DS_ACCELERATOR=cpu),
from the repository root, after the first one (`bash .ci/setup` makes the venv).

Each ```bash line of README.md after the first two (setup + main job, setup + tests: kept exactly) is checked
by running its first program with `--help` in that shell, so a bare `deepspeed`, `accelerate` or `ds-hetero`
(on no PATH a fresh shell has) fails here; a launched recipe is also run with the line's own arguments and
`--help` (its argument parser takes them), and every file the line names must exist. `ds-hetero validate`
lines, cheap, run whole (tests/helpers/shell_commands.py). The negative controls plant a bare `deepspeed` and
`ds-hetero` line.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers.shell_commands import ROOT, check_command

FIRST_TWO = (
    "bash .ci/setup && .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --deepspeed_config "
    "ds_configs/llava_colocated.json   # main job",
    "bash .ci/setup && .venv/bin/python -m pytest -q tests"
    "                                                                           # all tests",
)


def readme_commands(text: str) -> list[str]:
    """The lines of every ```bash block, in order."""
    return [line for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
            for line in block.splitlines() if line.strip()]


def _readme_lines() -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as f:
        return readme_commands(f.read())


def test_the_first_two_commands_are_kept_exactly():
    assert tuple(_readme_lines()[:2]) == FIRST_TWO
    assert os.path.isfile(os.path.join(ROOT, ".ci", "setup"))


def test_readme_names_the_packed_config_and_model_family():
    lines = _readme_lines()
    assert any("ds_configs/llava_packed.json" in line for line in lines)
    assert any("--model-family" in line for line in lines)


@pytest.mark.parametrize("line", _readme_lines()[2:])
def test_readme_command_runs_from_a_fresh_shell(line):
    check_command(line)


@pytest.mark.parametrize("line", [
    "deepspeed --num_gpus 4 recipes/train_llava.py --deepspeed_config ds_configs/llava_disaggregated.json",
    "ds-hetero validate ds_configs/llava_colocated.json --world-size 4",
])
def test_negative_control_a_bare_venv_program_fails(line):
    with pytest.raises(AssertionError, match="in a fresh shell failed"):
        check_command(line)


def test_negative_control_a_missing_config_fails():
    with pytest.raises(AssertionError, match="does not exist"):
        check_command(".venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --deepspeed_config ds_configs/nope.json")


def test_activating_the_venv_first_is_accepted():
    check_command("source .venv/bin/activate && ds-hetero validate ds_configs/llava_packed.json --world-size 4")
