"""recipes/bench_layouts.py in a tiny configuration: it runs end to end and compares like with like.

The benchmark's own launcher starts 4 gloo processes per row; here two rows (a heterogeneous
layout and plain DeepSpeed over the whole model), then both interleaved in one set of
processes, one timed step each, on a tiny LLaVA. Both engines must see the same first-step loss (same seeded model, same
batch, same objective), otherwise the timing comparison would not be between equal work.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes"))

import bench_layouts  # noqa: E402

pytestmark = pytest.mark.distributed


def test_bench_layouts_tiny(capsys):
    _, a = bench_layouts.parse_args(["--quick", "--warmup", "1", "--steps", "1", "--rounds", "1",
                                     "--image-size", "16", "--vision-hidden", "32", "--text-hidden", "32"])
    rows, paired, a = bench_layouts.run_benchmark(a, ["hetero tp2", "plain DS dp4"], log=lambda *x, **k: None)
    hetero, plain = rows
    assert hetero["first_loss"] == pytest.approx(plain["first_loss"], rel=1e-5)
    assert hetero["boundary_bytes"] > 0 and plain["boundary_bytes"] == 0
    assert all(r["step_s"] > 0 and len(r["peak_rss"]) == bench_layouts.WORLD for r in rows)
    assert {"vision.forward", "vision.backward", "language.forward", "language.backward", "optimizer"} <= set(
        hetero["split"]) and any(k.startswith("boundary.") for k in hetero["split"])
    assert set(paired) == {"hetero tp2", "plain DS dp4"} and all(len(v) == 1 for v in paired.values())
    bench_layouts.print_table(rows, paired, a)
    out = capsys.readouterr().out
    assert "interleaved" in out and "hetero tp2" in out
