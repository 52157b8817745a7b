"""benchmarks/plan_public.py prices the published GPU runs: its --json is a list of {"name", "unit",
"published", "predicted"} with numbers or [low, high] ranges, every published figure of the issue present."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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


def test_mimo_break_even_is_the_encoder_time_at_the_priced_gain(monkeypatch):
    """plan_bridge.encoder_break_even: at the gain the model prices, the break-even is the baseline's own encoder
    time per micro-batch on stage 0; a larger gain needs a slower encoder there (the control)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import plan_public
    from plan_bridge import encoder_break_even, per_gpu_gain, tutorial_pair

    from ds_hetero.planner.machine import PROFILES

    spec, wl = plan_public._spec_wl(os.path.join(plan_public.CONFIGS, "qwen3_5_27b.json"),
                                    plan_public.sample_row(2048, 2304, 256), 32, 2304)
    base, hetero = tutorial_pair(spec, wl, PROFILES["h100"])
    assert base.candidate.micro_batches == 16 and hetero.candidate.micro_batches == 16  # language-local MBS 1
    encoder = (base.breakdown["vision"]["compute"] + base.breakdown["vision"]["tp"]) / 16
    gain = per_gpu_gain(base, hetero)
    assert gain > 0
    assert encoder_break_even(base, hetero, gain) == pytest.approx(encoder, rel=1e-9)
    assert encoder_break_even(base, hetero, gain + 10) > encoder
