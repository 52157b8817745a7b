"""Homogeneous, colocated heterogeneous and disaggregated layouts of one LLaVA on 4 ranks, in one run.

    .venv/bin/python benchmarks/bench_layouts.py                       # both scenarios, ~5 min on 2 CPU cores
    .venv/bin/python benchmarks/bench_layouts.py --quick               # tiny sizes, ~1.5 min
    .venv/bin/python benchmarks/bench_layouts.py --scenario wide-vision   # a tower large in parameters (~3.5 min)
    .venv/bin/python benchmarks/bench_layouts.py --rows "hetero tp4" "plain DS dp4" ...   # any rows of LAYOUTS
    .venv/bin/python benchmarks/bench_layouts.py --profile             # + where the time goes (torch.profiler, one step)

A scenario is a model size; for each, one run launches a fresh set of 4 gloo processes per row
(so each row's peak memory is its own), builds the same seeded LLaVA (CLIP tower, 256 image
tokens per sample as LLaVA at 224 px, Llama LM) and trains it on the same global batches (16
samples) of the synthetic shapes-captioning data. The default scenarios:

    balanced       vision tower about the language model's size and compute
    large-vision   vision tower 2x the language model's parameters, 2.25x its compute per token

and the default rows (every other row of LAYOUTS is available with --rows):

    homogeneous     vision tp2 dp2, language tp2 dp2 (the encoder forced into the LLM's layout), mb 1
    hetero tp2      vision tp1 dp4, language tp2 dp2, colocated on all 4 ranks, mb 1
    ds_hetero dp4   vision tp1 dp4, language tp1 dp4, colocated, mb 1
    hetero tp2 mb4  hetero tp2 with 4 micro-batches: the colocated control for the pipelined rows
    disagg 2+2 tp   vision dp2 on ranks 0-1, language tp2 on ranks 2-3, 4 micro-batches in 1F1B
    disagg 2+2 dp   vision dp2 on ranks 0-1, language dp2 on ranks 2-3, 4 micro-batches in 1F1B

Every ds_hetero row goes through the same HeteroEngine (`ds_hetero.initialize`, ZeRO 1, AdamW,
global-norm clipping 1.0); "plain DS dp4" (with --rows) uses one deepspeed.initialize over the
whole model with the same config, optimizer, clipping, objective and samples per rank; "DS AutoTP
tp2" the same with DeepSpeed's own `"tensor_parallel": {"autotp_size": 2}` (language model
sharded, vision tower and projector replicated on both tp ranks, dp 2). Then all
rows run once more in ONE set of 4 processes holding every row's engine (disaggregated ones
too: each engine builds its own groups on all ranks), stepping them round-robin (A B C, C B A,
...), so the drift of a shared machine hits every row alike; the medians of the per-round ratios
are the speedups (and, with both dp4 rows, the plugin-overhead figure).

Reported per row: median step time (per step the slowest rank, after warm-up), all tokens/s
(text + image placeholders), per rank and label tokens/s, the ratio to the homogeneous row, the
bubble fraction of every rank (StepResult.bubble_fraction: the share of the step outside
forward, backward and optimizer spans, i.e. waiting at the boundary), CPU seconds per step
(all ranks; time.process_time) and the machine utilisation (CPU seconds / (step time x cores)),
the parameters each rank holds, peak memory per rank (max RSS; "+over start" subtracts the RSS
before the model was built), boundary bytes per step, and the time split per rank set (all ranks
for colocated rows; the vision and the language ranks for disaggregated ones). The first-step
loss must be equal on every row (same model, batches and objective; micro-batching only changes
the summation order): a cheap check that every row trains the same function.

On a 2-core machine the 4 ranks are oversubscribed (one thread each, two per core). A rank that
waits in a gloo collective sleeps and hands its core to another rank, so a pipeline bubble costs
no CPU as long as two ranks are runnable, and the step time is about (CPU seconds of all ranks)
/ (cores x util): compare the CPU s and util columns to see why a row wins. Absolute times are
low and noisy: read the ratios, and on a machine shared with other jobs prefer the interleaved
table (and its ratios of fastest steps) to the per-row table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the layouts_* modules beside this script

# The rows live in layouts_rows.py (plain DeepSpeed's in layouts_plain.py), the measurement in
# layouts_measure.py, the tables in layouts_report.py; the names the scripts and tests driving this
# benchmark use (validate_planner.py, tests/clients/test_bench_layouts.py) are re-exported here.
from cpu_ranks import launch  # noqa: E402,F401
from layouts_measure import run_benchmark, run_interleaved  # noqa: E402,F401
from layouts_report import print_table  # noqa: E402
from layouts_rows import (  # noqa: E402,F401  (F401: re-exported)
    DEFAULT_SCENARIOS, DEFAULTS, LAYOUTS, QUICK, SCENARIOS, Layout, Plain, batch_problems, build_model,
    ds_config, layout_of, layout_str, make_batches, with_param_counts)


def parse_args(argv=None):
    """Returns (args, [(scenario, a), ...]); a holds the sizes of that scenario."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny models and few steps (~1-2 min)")
    p.add_argument("--profile", action="store_true", help="profile one extra step per row (torch.profiler)")
    p.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=DEFAULT_SCENARIOS,
                   help=f"model sizes to run, one table each (default: {' '.join(DEFAULT_SCENARIOS)})")
    p.add_argument("--rows", nargs="+", choices=list(LAYOUTS),
                   help="only these rows, in every scenario (default: each scenario's rows)")
    p.add_argument("--no-interleaved", action="store_true", help="skip the interleaved phase")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results here")
    scenario_keys = {k for sc in SCENARIOS.values() for k in sc["sizes"]}
    for k, v in DEFAULTS.items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=None,
                       help=f"default {v} ({QUICK[k]} with --quick)"
                       + ("; some scenarios change it" if k in scenario_keys else ""))
    args = p.parse_args(argv)
    runs = []
    for name in args.scenario:
        sc = SCENARIOS[name]
        a = dict(QUICK if args.quick else DEFAULTS)
        a.update(sc["quick_sizes"] if args.quick else sc["sizes"])
        a.update({k: getattr(args, k) for k in DEFAULTS if getattr(args, k) is not None})
        a.update(seed=args.seed, profile=args.profile, rows=list(args.rows or sc["rows"]))
        problems = batch_problems(a, a["rows"])
        if problems:
            p.error("; ".join(problems))
        runs.append((name, a))
    return args, runs


def main(argv=None):
    args, runs = parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    t0 = time.perf_counter()
    results = []
    for scenario, a in runs:
        print(f"== scenario {scenario}", flush=True)
        rows, pair, a = run_benchmark(a, a["rows"], interleaved=not args.no_interleaved)
        results.append((scenario, rows, pair, a))
    for scenario, rows, pair, a in results:
        print_table(rows, pair, a, scenario)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"scenario": sc, "args": a, "rows": rows, "interleaved": pair}
                       for sc, rows, pair, a in results], f, indent=1, default=str)


if __name__ == "__main__":
    main()
