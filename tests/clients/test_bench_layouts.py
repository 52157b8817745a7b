"""benchmarks/bench_layouts.py in a tiny configuration: it runs end to end and compares like with like.

The benchmark's own launcher starts 4 gloo processes per row; here two rows in fresh processes (a
colocated heterogeneous layout and a disaggregated one pipelining 4 micro-batches), then those
two and plain DeepSpeed over the whole model interleaved in one set of processes (so a
disaggregated engine coexists with colocated ones and with plain DeepSpeed), one timed step
each, on a tiny LLaVA. Every row must see the same first-step loss (same seeded model, same
batch, same objective), otherwise the timing comparison would not be between equal work.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import bench_layouts  # noqa: E402

pytestmark = pytest.mark.distributed

ROWS = ["hetero tp2", "plain DS dp4", "disagg 2+2 tp"]


def test_bench_layouts_tiny(capsys):
    _, runs = bench_layouts.parse_args(["--quick", "--scenario", "balanced", "--rows", *ROWS, "--warmup", "1",
                                        "--steps", "1", "--rounds", "1", "--image-size", "16",
                                        "--vision-hidden", "32", "--text-hidden", "32"])
    (scenario, a), = runs
    rows, paired, a = bench_layouts.run_benchmark(a, a["rows"], log=lambda *x, **k: None,
                                                  fresh=["hetero tp2", "disagg 2+2 tp"])
    hetero, disagg = rows
    assert (hetero["name"], disagg["name"]) == ("hetero tp2", "disagg 2+2 tp")
    assert disagg["first_loss"] == pytest.approx(hetero["first_loss"], rel=1e-5)
    losses = a["interleaved_loss"]
    assert set(losses) == set(ROWS)
    assert all(v == pytest.approx(hetero["first_loss"], rel=1e-5) for v in losses.values()), losses
    assert hetero["boundary_bytes"] > 0 and disagg["boundary_bytes"] > 0
    assert all(r["step_s"] > 0 and r["cpu_s"] > 0 and len(r["peak_rss"]) == a["world"] for r in rows)
    assert {"vision.forward", "vision.backward", "language.forward", "language.backward", "optimizer"} <= set(
        hetero["groups"]["all"]["split"]) and any(k.startswith("boundary.") for k in hetero["groups"]["all"]["split"])

    # disaggregated: 4 pipelined micro-batches, one time split per rank set, each rank holds one stage
    assert disagg["micro_batches"] == 4 and hetero["micro_batches"] == 1
    assert set(disagg["groups"]) == {"vision", "language"}
    v, lang = disagg["groups"]["vision"], disagg["groups"]["language"]
    assert v["ranks"] == (0, 1) and lang["ranks"] == (2, 3)
    assert {"vision.forward", "vision.backward"} <= set(v["split"])
    assert not any(k.startswith("language") for k in v["split"])
    assert {"language.forward", "language.backward"} <= set(lang["split"]) and not any(
        k.startswith("vision") for k in lang["split"])
    assert {"boundary.rows", "boundary.grads"} <= set(v["split"]) & set(lang["split"])
    assert all(0.0 <= b < 1.0 for b in disagg["bubble"] + hetero["bubble"])
    assert max(disagg["params"]) < min(hetero["params"])  # a colocated rank holds both stages

    assert set(paired) == set(ROWS) and all(len(v) == 1 for v in paired.values())
    bench_layouts.print_table(rows, paired, a, scenario)
    out = capsys.readouterr().out
    assert "interleaved" in out and "disagg 2+2 tp" in out and "language 2-3" in out
