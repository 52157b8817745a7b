"""benchmarks/bench_packing.py in a tiny configuration: it runs end to end, every row trains the same
function (the benchmark checks the losses equal), and packing removes the padding (per sample: all
of it; row_mask: some) and does not worsen the step's language load (pure figures of the plans), on
the SFT mix and the shipped dataset."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import bench_packing  # noqa: E402

pytestmark = pytest.mark.distributed


def test_sft_mix_is_seeded_and_shaped():
    mix = bench_packing.sft_mix(400, 9, seed=0)
    assert mix == bench_packing.sft_mix(400, 9, seed=0)
    images = [i for i, _ in mix]
    assert 0.6 < images.count(1) / 400 < 0.8 and 0.1 < images.count(0) / 400 < 0.3
    assert max(i * 64 + t for i, t in mix) <= 8192 // 9


def test_bench_packing_tiny(capsys):
    table = bench_packing.main(["--quick", "--rounds", "1", "--batch", "8", "--text-hidden", "32",
                                "--text-layers", "2"])
    assert set(table) == {(ds, row) for ds in ("mix", "shipped") for row in ("samples", "packed", "row_mask")}
    for ds in ("mix", "shipped"):
        packed, row_mask, samples = table[ds, "packed"], table[ds, "row_mask"], table[ds, "samples"]
        # per sample: one row per rank and micro-batch, no padding
        assert samples["real"] == packed["real"] == packed["computed"] < samples["computed"]
        # sdpa scoring rows whole: they are cut (step/rows.py) and pad, less than the samples cut
        assert samples["real"] == row_mask["real"] <= row_mask["computed"] < samples["computed"]
        assert packed["step_max_mean"] <= samples["step_max_mean"] + 1e-9
    assert "max/mean (step)" in capsys.readouterr().out
