"""The command outputs quoted in docs/, regenerated from the commands themselves, so none goes stale.

    .venv/bin/python docs/samples.py           rewrite every sample in docs/*.md
    .venv/bin/python docs/samples.py --check   exit 1 naming each stale sample (tests/base/test_doc_samples.py)

A sample is a marker line, then a fenced block holding `$ COMMAND` and its output:

    <!-- sample: ds-hetero validate ds_configs/llava_colocated.json --world-size 4 -->
    ```
    $ .venv/bin/ds-hetero validate ds_configs/llava_colocated.json --world-size 4
    ...
    ```

Only `ds-hetero` commands are run (in process, from the repository root, stdout and stderr as the
terminal shows them); the block is shown with the venv's path so that it runs as written.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"^<!-- sample: (?P<command>.+?) -->\n```\n.*?^```\n", re.S | re.M)


def run(command: str) -> str:
    """`command`'s output, as `$ .venv/bin/COMMAND` then what it prints."""
    argv = shlex.split(command)
    if argv[0] != "ds-hetero":
        raise ValueError(f"sample {command!r}: only ds-hetero commands are run here")
    from ds_hetero.cli import main

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            main(argv[1:])
    finally:
        os.chdir(cwd)
    return f"$ .venv/bin/{command}\n{out.getvalue().rstrip()}\n"


def regenerated(text: str) -> str:
    """`text` with every sample's block rewritten from its command."""
    return MARKER.sub(lambda m: f"<!-- sample: {m['command']} -->\n```\n{run(m['command'])}```\n", text)


def stale(paths: list[str]) -> list[str]:
    """The docs whose samples differ from their commands' output today."""
    out = []
    for path in paths:
        with open(path) as f:
            text = f.read()
        if MARKER.search(text) and regenerated(text) != text:
            out.append(os.path.relpath(path, ROOT))
    return out


def main(argv: list[str]) -> int:
    paths = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    if "--check" in argv:
        bad = stale(paths)
        for path in bad:
            print(f"{path}: a sample differs from its command's output; run .venv/bin/python docs/samples.py",
                  file=sys.stderr)
        return 1 if bad else 0
    for path in paths:
        with open(path) as f:
            text = f.read()
        new = regenerated(text)
        if new != text:
            with open(path, "w") as f:
                f.write(new)
            print(f"rewrote {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main(sys.argv[1:]))
