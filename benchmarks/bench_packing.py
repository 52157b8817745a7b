"""Packed, token-balanced language micro-batches against the samples cut, on an SFT mix and the shipped data; one run.

    .venv/bin/python benchmarks/bench_packing.py            # 2 ranks, one per core; global batch 16 (~5 min loaded)
    .venv/bin/python benchmarks/bench_packing.py --quick    # fewer rounds
    .venv/bin/python benchmarks/bench_packing.py --world 4  # the same rows on 4 ranks (two per core on a 2-core machine)
    .venv/bin/python benchmarks/bench_packing.py --family qwen3.5   # the mix on Qwen3.5 (Gated DeltaNet) or gemma3

The mix (a seeded generator, `ds_hetero/toy/length_mix.py` `sft_mix`, which `ds-hetero plan --lengths sft`
prices too), shaped like the public VLM SFT mixes (LLaVA mix665k, ShareGPT4V) and scaled down by
`--scale` for CPU: 70% one image (576 tokens / scale) + a text of lognormal(5.2, 0.8) tokens; 10%
2-4 images + lognormal(5.0, 0.6); 20% text only, lognormal(6.4, 0.9) + 16; texts divided by the
scale too, every sample capped at 8192 / scale tokens. And the shipped dataset (recipes/data/shapes_llava.json,
what `recipes/train_llava.py --data` reads: 48 LLaVA-JSON rows, one or two images or none, 17-162 tokens),
encoded with the bench model's processor (ds_hetero/toy/processors.py), a seeded draw of the batch per step
(with replacement only when the batch is larger than the 48 rows).

Rows (colocated, vision dp = language dp = world, ZeRO 1, AdamW, clipping 1.0, 2 micro-batches; the
model under sdpa, transformers' default):

    samples   hetero_parallel.language_batching "samples": each language dp rank takes a contiguous
              share of every micro-batch, padded to its longest sample
    packed    "packed": the global batch's samples to (micro-batch, dp rank) bins by token cost, across
              micro-batches (step/packing.py), one packed row each, sdpa called once per sample
              (models/per_sample_attention.py, the default)
    row_mask  "packed" with packed_attention "row_mask": the same bins, each rank's samples in the rows
              that cost sdpa least when it scores every row whole under the block-diagonal mask
              (step/rows.py), padded to the longest

`--family qwen3.5|gemma3` runs the rows "samples" and "packed" on the mix in that family's format
(benchmarks/packing_families.py: Qwen3.5's Gated DeltaNet layers restart at every sample of a packed
row, Gemma 3's sliding windows stay inside each sample); the shipped rows and "row_mask" are LLaVA's.

Every row's engine lives in ONE set of processes and they step in turn on the same batches (A B C,
C B A, ...), so the drift of a shared machine hits all alike. Per row: the step time (slowest rank,
median of rounds), the ratio to "samples", real / computed language tokens (computed: every rank's
rows padded to its longest), and the language stage's max/mean load over the dp ranks (the step
plan's cost per rank, worst micro-batch, mean over steps; step/packing.py `load_figures`) and the step's
(`step_max_mean`: the slowest rank's cost summed over the micro-batches over the means', the step's time over
a balanced one's; mean over steps).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_ranks import launch  # noqa: E402

from packing_families import FAMILIES, make_model as family_model, mix_sample  # noqa: E402

from ds_hetero.toy.length_mix import sft_mix  # noqa: E402  (the mix `ds-hetero plan --lengths sft` prices)

ROWS = ("samples", "packed", "row_mask")
DATASETS = ("mix", "shipped")
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "recipes", "data", "shapes_llava.json")


def make_model(a):
    return family_model(a.family, a.scale, a.text_hidden, a.text_layers)


def batches(model, a, n: int):
    import torch

    out = []
    for step in range(n):
        gen = torch.Generator().manual_seed(step)
        out.append([mix_sample(model, a.family, images, text_len, a.scale, gen)
                    for images, text_len in sft_mix(a.batch, a.scale, seed=1000 + step)])
    return out


def shipped_batches(model, a, n: int):
    """`n` global batches of the shipped dataset: a seeded draw of `a.batch` rows each (48 rows in all)."""
    import random

    from ds_hetero.sft_data import SFTDataset
    from ds_hetero.toy.processors import tiny_processor

    data = SFTDataset.from_file(SHIPPED, tiny_processor(model))
    rows = [data[i] for i in range(len(data))]
    def draw(rng):  # without replacement while the rows last (a larger batch repeats some)
        return rng.sample(range(len(rows)), a.batch) if a.batch <= len(rows) else rng.choices(range(len(rows)), k=a.batch)
    return [[rows[i] for i in draw(random.Random(2000 + step))] for step in range(n)]


def config(row, a, world):
    return {
        "train_batch_size": a.batch, "zero_optimization": {"stage": 1}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
        "hetero_parallel": {"micro_batches": 2, "language_batching": "samples" if row == "samples" else "packed",
                            **({"packed_attention": "row_mask"} if row == "row_mask" else {}),
                            "stages": {"vision": {"dp": world}, "language": {"dp": world}}},
    }


def plan_figures(engine, samples):
    """The step's language figures from its plan: real, computed, max_mean (worst micro-batch), step_max_mean."""
    from ds_hetero.step.step_plan import StepPlan

    plan = StepPlan(engine.config, engine.adapter.encoders(), samples, language_cost=engine.adapter.language_cost,
                    dense_attention=engine.adapter.dense_rows(engine.config.packed_attention))
    return plan.language_load()


def run(rank, world, a):
    import time

    import torch
    import torch.distributed as dist

    import ds_hetero

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})  # one rank per core at 2 ranks: waiting is real
    torch.set_num_threads(1)
    engines = {row: ds_hetero.initialize(make_model(a), config(row, a, world)) for row in a.rows}
    model, n = engines["samples"].model, a.warmup + a.rounds
    make = {"mix": batches, "shipped": shipped_batches}
    data = {ds: make[ds](model, a, n) for ds in a.datasets}
    rec = {(ds, row): [] for ds in a.datasets for row in a.rows}
    for i in range(n):
        for ds in a.datasets:  # interleaved: every round both datasets, every row, the order alternating
            samples = data[ds][i]
            for row in (a.rows if i % 2 == 0 else a.rows[::-1]):
                engine = engines[row]
                dist.barrier()
                t0 = time.perf_counter()
                r = engine.train_batch(samples)
                wall = time.perf_counter() - t0
                if i >= a.warmup:
                    rec[ds, row].append(dict(wall=wall, loss=r.loss, **plan_figures(engine, samples)))
    for e in engines.values():
        e.groups.destroy()
    return rec


def summarize(per_rank):
    table = {}
    for key in per_rank[0]:
        steps = list(zip(*(r[key] for r in per_rank)))
        first = [s[0] for s in steps]
        table[key] = dict(step=statistics.median(max(x["wall"] for x in s) for s in steps),
                          real=sum(x["real"] for x in first), computed=sum(x["computed"] for x in first),
                          max_mean=statistics.mean(x["max_mean"] for x in first),
                          step_max_mean=statistics.mean(x["step_max_mean"] for x in first),
                          losses=[x["loss"] for x in first])
    for ds, row in table:  # the same function, less work
        x, y = table[ds, "samples"]["losses"], table[ds, row]["losses"]
        assert all(abs(p - q) <= 1e-4 * abs(p) for p, q in zip(x, y)), (ds, row, x, y)
    return table


def print_table(table, a, world):
    binding = "one per core" if world <= len(os.sched_getaffinity(0)) else f"on {len(os.sched_getaffinity(0))} cores"
    print(f"\n{a.family} (text {a.text_hidden} x {a.text_layers} layers), {world} ranks {binding}, global batch "
          f"{a.batch}, 2 micro-batches; mix: SFT mix / {a.scale}"
          f"{', shipped: ' + os.path.basename(SHIPPED) if 'shipped' in a.datasets else ''}; medians of "
          f"{a.rounds} rounds (machine shared: ratios only; load {os.getloadavg()[0]:.1f})")
    print(f"{'data':8}  {'row':8}  {'step s':>7}  {'vs samples':>10}  {'real/computed':>13}  "
          f"{'max/mean (worst mb)':>19}  {'max/mean (step)':>15}")
    for (ds, row), r in table.items():
        base = table[ds, "samples"]["step"]
        print(f"{ds:8}  {row:8}  {r['step']:7.3f}  {base / r['step']:9.2f}x  {r['real'] / r['computed']:13.3f}  "
              f"{r['max_mean']:19.2f}  {r['step_max_mean']:15.2f}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 warm-up, 3 rounds")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--scale", type=int, default=9, help="divide token counts by this (576 / 9 = 64 per image)")
    p.add_argument("--text-hidden", type=int, default=128)
    p.add_argument("--text-layers", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--datasets", default=None, help="comma-separated: mix, shipped (LLaVA; the others: mix)")
    p.add_argument("--family", default="llava", choices=FAMILIES)
    a = p.parse_args(argv)
    llava = a.family == "llava"
    a.datasets = tuple(d for d in (a.datasets or ",".join(DATASETS if llava else ("mix",))).split(",") if d)
    a.rows = ROWS if llava else ROWS[:2]
    if not llava and "shipped" in a.datasets:
        p.error("--datasets shipped: the shipped rows are LLaVA's (--family llava)")
    if not a.datasets or set(a.datasets) - set(DATASETS):
        p.error(f"--datasets: a comma-separated choice of {DATASETS}")
    a.rounds = a.rounds if a.rounds is not None else (3 if a.quick else 8)
    return a


def main(argv=None):
    a = parse_args(argv)
    table = summarize(launch(run, a, world=a.world, timeout=3600.0))
    print_table(table, a, a.world)
    return table


if __name__ == "__main__":
    main()
