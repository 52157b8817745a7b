"""benchmarks/bench_data.py's pure part (no launch, a few seconds): from the plan of a light batch, a rank
reads exactly the samples its stages use (1.00) at every size, and the old design (the whole global batch
on every rank) reads more than they use once the language stage has more than one dp rank (the negative
control: the measure can tell the two apart)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import bench_data  # noqa: E402


def test_scaled_config_keeps_tp_and_fills_dp():
    ds = bench_data.scaled_config(8)
    stages = ds["hetero_parallel"]["stages"]
    assert ds["train_batch_size"] == 8 * bench_data.PER_RANK
    assert (stages["vision"]["dp"], stages["language"]["tp"], stages["language"]["dp"]) == (8, 2, 4)


def test_plan_reads_what_the_stages_use():
    table = bench_data.plan_table(worlds=(2, 4, 8, 64))
    for world, row in table.items():
        assert row["batch"] == world * bench_data.PER_RANK
        assert row["new"] == 1.0, (world, row)
    assert table[2]["old"] == 1.0  # language dp 1: every rank's language share is the whole batch
    for world in (4, 8, 64):  # the old design's ratio grows with the ranks
        assert table[world]["old"] > 1.0, (world, table[world])
    assert table[64]["old"] > table[8]["old"] > table[4]["old"]
