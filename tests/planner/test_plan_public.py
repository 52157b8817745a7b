"""benchmarks/plan_public.py prices the published GPU runs: its --json is a list of {"name", "unit",
"published", "predicted"} with numbers or [low, high] ranges, every published figure of the issue present."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _number_or_range(v) -> bool:
    if isinstance(v, list):
        return len(v) == 2 and all(isinstance(x, (int, float)) for x in v) and v[0] <= v[1]
    return isinstance(v, (int, float))


def test_plan_public_json_format():
    env = {**os.environ, "PYTHONPATH": ROOT, "DS_ACCELERATOR": "cpu"}
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "plan_public.py"), "--json"],
                         capture_output=True, text=True, env=env, timeout=600, check=True).stdout
    rows = json.loads(out)
    assert isinstance(rows, list) and rows
    for r in rows:
        assert set(r) == {"name", "unit", "published", "predicted"}, r
        assert _number_or_range(r["published"]) and _number_or_range(r["predicted"]), r
    published = {(r["unit"], json.dumps(r["published"])) for r in rows}
    for want in [("TFLOP/s/GPU", "57.7"), ("tokens/s/GPU", "2507"), ("s", "3.27"), ("TFLOP/s/GPU", "32.2"),
                 ("%", "[23.0, 44.7]")]:
        assert want in published, (want, published)
    assert all(r["predicted"] != 0 for r in rows)
