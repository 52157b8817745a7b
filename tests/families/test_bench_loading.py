"""benchmarks/bench_loading.py, disaggregated rows, on a model large enough to see peak memory.

Each rank's peak RSS while the model and engines are built (ZeRO 0, so DeepSpeed adds no copy):
with the whole model built on every rank, every rank peaks at the whole model or more; with
meta + weights, a rank peaks at what it holds plus less than half of what it does not hold. The
robust checks are the byte counts: a vision rank reads nothing of the language stage and the
language ranks nothing of the vision stage (their other stage's parameters stay on meta), and a
tp2 language rank reads exactly half of every sharded tensor.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import bench_loading  # noqa: E402

pytestmark = pytest.mark.distributed

MB = 2**20


def test_meta_plus_weights_holds_only_the_ranks_own_shards(capsys):
    _, a = bench_loading.parse_args(["--text-hidden", "512", "--text-layers", "6", "--vocab", "4000",
                                     "--vision-hidden", "384", "--vision-layers", "2", "--vision-heads", "6"])
    rows, sizes = bench_loading.run(a, placements=("disaggregated",), log=lambda *x, **k: None)
    bench_loading.print_table(rows, sizes)
    full = (sizes["vision"] + sizes["language"]) / MB
    built, loaded = rows["disaggregated", "built"], rows["disaggregated", "meta+weights"]
    for rank, (b, m) in enumerate(zip(built, loaded)):
        mine, other = ("vision", "language") if rank < 2 else ("language", "vision")
        assert m["stages"] == [mine] and set(m["read"]) == {mine}, (rank, m)
        assert m["held_mb"] == pytest.approx(m["read"][mine]["bytes_read"] / MB)  # holds what it read, no more
        assert b["peak_over_start_mb"] >= 0.9 * full, (rank, b, full)
        assert m["peak_over_start_mb"] <= m["held_mb"] + 0.5 * (full - m["held_mb"]), (rank, m, full)
    for m in loaded[2:]:  # tp2: half of every sharded tensor, the replicated ones whole
        lang = m["read"]["language"]
        assert 2 * lang["sharded_bytes_read"] == lang["sharded_bytes_full"] > 0
        assert lang["bytes_read"] < 0.75 * sizes["language"]
    for m in loaded[:2]:
        assert m["read"]["vision"]["bytes_read"] == sizes["vision"]
    print(capsys.readouterr().out)
