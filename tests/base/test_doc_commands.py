"""Every command line that docs/*.md, the docstrings of recipes/ and benchmarks/ and the Accelerate YAMLs' header
comments show runs as written after `bash .ci/setup`, as the README's do (tests/base/test_readme_commands.py):
from the repository root, in a fresh shell with no venv on its PATH.

A command line is a line of a ```bash / ```sh / plain ``` block, or of a block indented by 4 spaces, whose
program (after `VAR=value` settings) is a venv program, bare or by path, or one of ours (`recipes/x.sh`); a
line ending in `\\` goes on on the next. Its program must be a path (a bare `deepspeed`, `accelerate`,
`ds-hetero` or `python` is on no PATH after setup) that runs `--help` in a fresh shell; files of ours it
names must exist (not those it writes); a `ds-hetero validate` of one of our configs runs whole; a launched
script of ours takes the line's arguments with `--help` (all the lines of one script in one process). A
usage line with placeholders (`[--x N]`, `...`, `<x>`, `A|B`) and a user's own script or config
(`my_sft.py`, `zero3.json`) are checked for their program only. Programs of `.venv-low`
(`DS_HETERO_PINS=low bash .ci/setup`: ms-swift) are checked where it exists. Negative controls: a bare
program, a missing script, a refused argument, an indented and a continued line found.
"""

from __future__ import annotations

import glob
import os
import re
import shlex

import pytest

from tests.helpers.shell_commands import OUR_FOLDERS, ROOT, check_command, scripts_help, split_command

# what a fresh machine has without the venv
SYSTEM_PROGRAMS = {"bash", "cd", "env", "export", "cat", "ls", "mkdir", "rm", "cp", "git", "nvidia-smi"}
# programs the venv installs: a line starting with one of them, bare or by path, is a command line
VENV_PROGRAMS = {"deepspeed", "accelerate", "ds-hetero", "python", "python3", "pytest", "torchrun", "trl", "swift"}
SYNOPSIS = re.compile(r"\[|\.\.\.|<[^>]*>|\|")
FENCE = re.compile(r"^```(\w*)\s*$")
SETTING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*\s+")


def _program(line: str) -> str:
    rest = line.strip()
    while SETTING.match(rest):
        rest = SETTING.sub("", rest, count=1)
    return rest.split(" ", 1)[0] if rest else ""


def _is_command(line: str) -> bool:
    program = _program(line)
    return (os.path.basename(program) in VENV_PROGRAMS and (program in VENV_PROGRAMS or "/bin/" in program)) \
        or bool(re.match(OUR_FOLDERS, program) and program.endswith((".sh", ".py")))  # not a path in output


def command_lines(text: str) -> list[str]:
    """The command lines of a Markdown page or docstring (see the module docstring), continuations joined."""
    found, fence, pending = [], None, ""
    for raw in text.splitlines():
        match = FENCE.match(raw.strip()) if not raw.startswith("    ") else None
        if match:
            fence = None if fence is not None else match.group(1)
            continue
        code = fence in ("bash", "sh", "") if fence is not None else raw.startswith("    ")
        if not code:
            pending = ""
            continue
        line = raw.strip()
        if pending:
            line = f"{pending} {line}"
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        pending = ""
        if _is_command(line):
            found.append(line)
    return found


def check_doc_command(line: str) -> None:
    """AssertionError saying why a documented `line` would not run as written after `bash .ci/setup`."""
    prefix, settings, words = split_command(line)
    program = words[0]
    assert "/" in program or program in SYSTEM_PROGRAMS, (
        f"{line!r}: a bare `{program}` is on no PATH after `bash .ci/setup` (the venv is never activated); "
        f"write .venv/bin/{program}")
    if program.startswith(".venv-low/"):
        with open(os.path.join(ROOT, ".ci", "setup")) as f:
            assert "VENV=.venv-low" in f.read(), f"{line!r}: .ci/setup makes no .venv-low"
        if not os.path.isdir(os.path.join(ROOT, ".venv-low")):
            return  # the low set is not installed on this machine
    if re.match(OUR_FOLDERS, program):  # a script of ours run directly (recipes/check_gpu.sh): never run here
        assert os.access(os.path.join(ROOT, program), os.X_OK), f"{line!r}: {program} is not an executable file"
        return
    synopsis = bool(SYNOPSIS.search(" ".join(words)))
    configs = [w for w in words[2:] if w.endswith((".json", ".yaml"))]
    # a launched script's arguments: test_doc_scripts_take_their_arguments, one process per script
    check_command(line, check_scripts=False,
                  run_validate=not synopsis and all(re.match(OUR_FOLDERS, w) for w in configs))


def launched_script(line: str) -> tuple[str, str] | None:
    """(script, the script and its arguments) of a line that launches a script of ours with arguments that are
    not placeholders; None otherwise."""
    _, _, words = split_command(line)
    scripts = [i for i, w in enumerate(words) if w.endswith(".py")]
    if not scripts or SYNOPSIS.search(" ".join(words)) or not re.match(OUR_FOLDERS, words[scripts[0]]) \
            or not os.path.isfile(os.path.join(ROOT, words[scripts[0]])):  # a missing one: the line's own test says so
        return None
    with open(os.path.join(ROOT, words[scripts[0]])) as f:
        # a script without an argument parser would do its work for --help: such a script is never run here
        assert "ArgumentParser" in f.read(), f"{line!r}: {words[scripts[0]]} has no argument parser to answer --help"
    return words[scripts[0]], shlex.join(words[scripts[0]:])


def _docs() -> list[tuple[str, str]]:
    lines = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        with open(path) as f:
            lines += [(os.path.relpath(path, ROOT), line) for line in command_lines(f.read())]
    return lines


def _script_docstrings() -> list[tuple[str, str]]:
    import ast

    lines = []
    scripts = [os.path.join(ROOT, folder, name) for folder in ("recipes", "recipes/data", "benchmarks") for name in
               sorted(os.listdir(os.path.join(ROOT, folder))) if name.endswith(".py")]
    for path in scripts:
        with open(path) as f:
            doc = ast.get_docstring(ast.parse(f.read()), clean=False) or ""
        lines += [(os.path.relpath(path, ROOT), line) for line in command_lines(doc)]
    return lines


def _yaml_comments() -> list[tuple[str, str]]:
    """The commands the Accelerate YAMLs' header comments show (`# .venv/bin/accelerate launch ...`)."""
    lines = []
    for path in sorted(glob.glob(os.path.join(ROOT, "ds_configs", "*.yaml"))):
        with open(path) as f:
            lines += [(os.path.relpath(path, ROOT), line[2:].strip()) for line in f
                      if line.startswith("# ") and _is_command(line[2:])]
    return lines


def _ids(lines: list[tuple[str, str]]) -> list[str]:
    return [f"{os.path.basename(path)}:{i}" for i, (path, _) in enumerate(lines)]


@pytest.mark.parametrize("page, line", _docs(), ids=_ids(_docs()))
def test_doc_command_runs_from_a_fresh_shell(page, line):
    check_doc_command(line)


@pytest.mark.parametrize("script, line", _script_docstrings() + _yaml_comments(),
                         ids=_ids(_script_docstrings() + _yaml_comments()))
def test_script_docstring_command_runs_from_a_fresh_shell(script, line):
    check_doc_command(line)


def _launched() -> dict[str, list[tuple[str, str]]]:
    """script -> [(the doc line, the script and its arguments)] over docs/*.md and the scripts' docstrings."""
    by_script: dict[str, list[tuple[str, str]]] = {}
    for _, line in _docs() + _script_docstrings() + _yaml_comments():
        found = launched_script(line)
        if found:
            by_script.setdefault(found[0], []).append((line, found[1]))
    return by_script


@pytest.mark.parametrize("script", sorted(_launched()))
def test_doc_scripts_take_their_arguments(script):
    """Each documented launch of a script of ours: the script, run with the line's arguments and --help, exits 0
    (its parser takes the options and values before --help). One process per script."""
    lines = _launched()[script]
    results = scripts_help(tuple(args for _, args in lines))
    refused = [f"{line!r}: exit {code}: {out}" for (line, _), (code, out) in zip(lines, results) if code != 0]
    assert not refused, "\n".join(refused)


def test_the_entry_points_pages_are_covered():
    found = {line.split()[0] + " " + line.split()[-1] for page, line in _docs()
             if page == os.path.join("docs", "trainer-and-accelerate.md")}
    assert found >= {".venv/bin/deepspeed ds_configs/llava_colocated.json",
                     ".venv/bin/accelerate recipes/accelerate_llava.py"}, found
    assert len([1 for script, _ in _script_docstrings() if script.startswith("recipes")]) >= 15
    assert len(_yaml_comments()) == 2  # the two Accelerate YAMLs


@pytest.mark.parametrize("line", [
    "deepspeed --num_gpus 4 recipes/hf_trainer_llava.py --deepspeed ds_configs/llava_colocated.json",
    "accelerate launch --config_file ds_configs/accelerate_colocated.yaml recipes/accelerate_llava.py",
    "DS_HETERO_PARALLEL=hetero.json python benchmarks/bench_memory.py --rounds 2",
])
def test_negative_control_a_bare_program_fails(line):
    assert command_lines(f"```bash\n{line}\n```\n") == [line]
    with pytest.raises(AssertionError, match="is on no PATH after"):
        check_doc_command(line)


def test_negative_control_a_refused_argument_fails():
    (code, out), = scripts_help(("recipes/train_llava.py --model-family no-such-family",))
    assert code == 2 and "invalid choice" in out


def test_negative_control_a_missing_script_fails():
    with pytest.raises(AssertionError, match="does not exist"):
        check_doc_command(".venv/bin/python benchmarks/bench_nothing.py --quick")


def test_indented_and_continued_lines_are_found():
    text = ("Prose with `deepspeed` named.\n\n    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py \\\n"
            "        --steps 2\n\n```\nds-hetero validate c.json\nnot a command\n```\n```python\npython x.py\n```\n")
    assert command_lines(text) == [".venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --steps 2",
                                   "ds-hetero validate c.json"]
