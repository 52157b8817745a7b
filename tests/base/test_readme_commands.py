"""Every README command runs as written from a fresh shell (`env -i`, PATH=/usr/bin:/bin, DS_ACCELERATOR=cpu),
from the repository root, after the first one (`bash .ci/setup` makes the venv).

Each ```bash line of README.md after the first two (setup + main job, setup + tests: kept exactly) is checked
by running its first program with `--help` in that shell, so a bare `deepspeed`, `accelerate` or `ds-hetero`
(on no PATH a fresh shell has) fails here; a launched recipe is also run with the line's own arguments and
`--help` (its argument parser takes them), and every file the line names must exist. `ds-hetero validate`
lines, cheap, run whole. The negative controls plant a bare `deepspeed` and `ds-hetero` line.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRESH_ENV = {"PATH": "/usr/bin:/bin", "DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1"}
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


def _strip_comment(line: str) -> str:
    return re.split(r"\s+#\s", line, maxsplit=1)[0].strip()


def _shell(command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/bash", "--noprofile", "--norc", "-c", command], cwd=ROOT, env=FRESH_ENV,
                          capture_output=True, text=True, timeout=timeout)


@functools.lru_cache(maxsize=None)
def _help(prefix: str, program: str) -> subprocess.CompletedProcess:
    return _shell(f"{prefix}{shlex.quote(program)} --help")  # once per program: DeepSpeed's takes seconds


def check_command(line: str) -> None:
    """AssertionError saying why `line` would not run as written on a fresh machine (after setup)."""
    command = _strip_comment(line)
    *setup, last = [part.strip() for part in command.split("&&")]
    prefix = "".join(f"{part} && " for part in setup)  # e.g. `source .venv/bin/activate && `
    words = shlex.split(last)
    program = words[0]
    proc = _help(prefix, program)
    assert proc.returncode == 0, f"{line!r}: `{program} --help` in a fresh shell failed: {proc.stderr[-600:]}"
    for word in words[1:]:
        if re.match(r"^(recipes|ds_configs|docs|benchmarks)/", word):
            assert os.path.exists(os.path.join(ROOT, word)), f"{line!r}: {word} does not exist"
    scripts = [i for i, word in enumerate(words) if word.endswith(".py")]
    if scripts:  # a launched recipe: its own parser takes the line's arguments
        i = scripts[0]
        args = " ".join(shlex.quote(w) for w in words[i:])
        proc = _shell(f"{prefix}.venv/bin/python {args} --help")
        assert proc.returncode == 0, f"{line!r}: the recipe refuses its arguments: {proc.stderr[-600:]}"
    if words[1:2] == ["validate"]:  # cheap: run it as written
        proc = _shell(f"{prefix}{last}")
        assert proc.returncode == 0, f"{line!r}: {proc.stdout[-300:]}{proc.stderr[-600:]}"


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
