"""Does a command shown to a user run as written on a fresh machine after `bash .ci/setup`? Checked cheaply.

A fresh shell (`env -i`, PATH=/usr/bin:/bin, DS_ACCELERATOR=cpu) in the repository root has no venv on its
PATH, so a bare `deepspeed`, `accelerate` or `ds-hetero` fails there while `.venv/bin/...` runs. `check_command`
runs the line's first program with `--help` in that shell, checks that every file of ours the line names
exists (but the files it writes), runs a launched script (`recipes/x.py`, `benchmarks/x.py`) with the line's
own arguments and `--help` (its argument parser takes them), and runs `ds-hetero validate` lines whole
(cheap). Used by tests/base/test_readme_commands.py (README.md) and tests/base/test_doc_commands.py (docs/*.md,
the scripts' docstrings).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRESH_ENV = {"PATH": "/usr/bin:/bin", "DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1"}
# folders of this repository a command line names files in (a user's own files are not checked)
OUR_FOLDERS = r"^(recipes|ds_configs|docs|benchmarks)/"
# options whose value is a file the command writes: not there before it runs
OUTPUT_OPTIONS = {"--write", "--save", "--trace", "--summary-json", "--summary_json", "--output_dir", "--state-dir",
                  "--to-hf", "--log-jsonl", "--save_final"}
# settings before the program (`DS_HETERO_PARALLEL=hetero.json deepspeed ...`)
SETTING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def strip_comment(line: str) -> str:
    return re.split(r"\s+#\s", line, maxsplit=1)[0].strip()


def shell(command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/bash", "--noprofile", "--norc", "-c", command], cwd=ROOT, env=FRESH_ENV,
                          capture_output=True, text=True, timeout=timeout)


@functools.lru_cache(maxsize=None)
def _help(prefix: str, *program: str) -> subprocess.CompletedProcess:
    return shell(f"{prefix}{shlex.join(program)} --help")  # once per program: DeepSpeed's takes seconds


@functools.lru_cache(maxsize=None)
def _script_help(prefix: str, args: str) -> subprocess.CompletedProcess:
    return shell(f"{prefix}.venv/bin/python {args} --help")


def split_command(line: str) -> tuple[str, list[str], list[str]]:
    """(setup prefix `a && b && `, settings `VAR=value`, the words of the last command) of a line."""
    command = strip_comment(line)
    *setup, last = [part.strip() for part in command.split("&&")]
    prefix = "".join(f"{part} && " for part in setup)  # e.g. `source .venv/bin/activate && `
    words = shlex.split(last)
    settings = []
    while words and SETTING.match(words[0]):
        settings.append(words.pop(0))
    return prefix, settings, words


def check_command(line: str, run_validate: bool = True, check_scripts: bool = True) -> None:
    """AssertionError saying why `line` would not run as written on a fresh machine (after setup)."""
    prefix, settings, words = split_command(line)
    program = words[0]
    proc = _help(prefix, program)
    if proc.returncode != 0 and len(words) > 1 and re.fullmatch(r"[a-z][a-z0-9_-]*", words[1]):
        # a CLI whose help needs its subcommand (ms-swift: `swift --help` raises, `swift sft --help` answers)
        proc = _help(prefix, program, words[1])
        program = f"{program} {words[1]}"
    assert proc.returncode == 0, f"{line!r}: `{program} --help` in a fresh shell failed: {proc.stderr[-600:]}"
    for before, word in zip(words, words[1:]):
        if re.match(OUR_FOLDERS, word) and before not in OUTPUT_OPTIONS:
            assert os.path.exists(os.path.join(ROOT, word)), f"{line!r}: {word} does not exist"
    scripts = [i for i, word in enumerate(words) if word.endswith(".py")]
    if scripts and check_scripts:  # a launched script: its own parser takes the line's arguments
        i = scripts[0]
        proc = _script_help(prefix, " ".join(shlex.quote(w) for w in words[i:]))
        assert proc.returncode == 0, f"{line!r}: the script refuses its arguments: {proc.stderr[-600:]}"
    if words[1:2] == ["validate"] and run_validate:  # cheap: run it as written
        last = " ".join(shlex.quote(w) for w in [*settings, *words])
        proc = shell(f"{prefix}{last}")
        assert proc.returncode == 0, f"{line!r}: {proc.stdout[-300:]}{proc.stderr[-600:]}"


# Runs a script as `python script args --help` would, once per argument list, in one process: the imports a
# recipe's --help pays (torch, transformers: seconds) are paid once for all the lines that launch it.
_AS_MAIN_WITH_HELP = """
import contextlib, io, json, runpy, shlex, sys
results = []
for line in sys.argv[1:]:
    sys.argv, out, code = shlex.split(line) + ["--help"], io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:
            code = 1
            print(repr(exc), file=out)
    results.append([code, out.getvalue()[-600:]])
print("@@results " + json.dumps(results))
"""


def scripts_help(arg_lines: tuple[str, ...]) -> list[tuple[int, str]]:
    """(exit code, output tail) of `.venv/bin/python <args> --help` for each `args` (a script and its
    arguments), all in one fresh-shell process."""
    proc = shell(".venv/bin/python -c " + shlex.quote(_AS_MAIN_WITH_HELP) + " "
                 + " ".join(shlex.quote(a) for a in arg_lines))
    tail = [line for line in proc.stdout.splitlines() if line.startswith("@@results ")]
    assert proc.returncode == 0 and tail, f"the script runner failed: {proc.stdout[-600:]}{proc.stderr[-600:]}"
    return [tuple(r) for r in json.loads(tail[-1][len("@@results "):])]
