"""Qwen2.5-Omni thinker on 4 ranks: both encoders in the LLM's layout vs each encoder in its own, interleaved.

    .venv/bin/python benchmarks/bench_omni.py             # ~3 min on 2 CPU cores
    .venv/bin/python benchmarks/bench_omni.py --rounds 12 --quick

Rows (all through the same HeteroEngine: ZeRO 1, AdamW, global-norm clipping 1.0, 2 micro-batches,
global batch 16 samples mixing image only, audio only, both and neither):

    llm layout      vision tp2 dp2, audio tp2 dp2, language tp2 dp2  (encoders forced into the LLM's layout)
    own layouts     vision tp1 dp4, audio tp1 dp4, language tp2 dp2  (colocated, each its own layout)
    mixed           vision dp2 + language tp2 on ranks 0-1, audio dp2 on ranks 2-3 (1F1B)

Every row's engine is built in ONE set of 4 gloo processes and the rows are stepped round-robin
(A B C, C B A, ...), so the drift of a shared machine hits every row alike; the ratios are the
medians of the per-round ratios of step times (per step, the slowest rank). Also per row: the
first-step loss (equal on every row: the same model, batches and objective), and the boundary
forward bytes per step summed over the encoders with their lower bound (every row a language rank
needs and does not hold, sent once; the communicator reaches it when the two are equal).

On a 2-core machine the 4 ranks are oversubscribed and the machine may be shared with other jobs:
absolute times are noisy, read the interleaved ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROWS = {
    "llm layout": ("colocated", {"vision": {"tp": 2, "dp": 2}, "audio": {"tp": 2, "dp": 2},
                                 "language": {"tp": 2, "dp": 2}}),
    "own layouts": ("colocated", {"vision": {"dp": 4}, "audio": {"dp": 4}, "language": {"tp": 2, "dp": 2}}),
    "mixed": ("mixed", {"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 2, "ranks": [2, 3]},
                        "language": {"tp": 2, "dp": 1, "ranks": [0, 1]}}),
}


def sizes(quick: bool) -> dict:
    if quick:
        return dict(model=dict(text_hidden=64, vision_hidden=32, audio_hidden=32), image=(1, 8, 8), frames=64)
    return dict(model=dict(text_hidden=128, text_layers=2, vision_hidden=128, vision_depth=4, audio_hidden=128,
                           audio_layers=4), image=(1, 16, 16), frames=128)


def batches(model, n: int, size: dict, seed: int = 0):
    from ds_hetero.testing.omni_samples import omni_samples

    img, frames = ("image", size["image"]), ("audio", size["frames"])
    kinds = [[img], [frames], [frames, img], [], [img, frames], [frames], [img], [("audio", size["frames"] // 2)]]
    return [omni_samples(model, (kinds * 2)[:16], text_len=16, seed=seed + k) for k in range(n)]


def config(placement: str, stages: dict) -> dict:
    return {"train_batch_size": 16, "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
            "gradient_clipping": 1.0, "steps_per_print": 10**6,
            "hetero_parallel": {"placement": placement, "micro_batches": 2, "stages": stages}}


def _run(rank, world_size, rounds, quick, rows):
    import copy

    import torch
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.toy import tiny_qwen2_5_omni

    torch.set_num_threads(1)
    size = sizes(quick)
    base = tiny_qwen2_5_omni(seed=0, **size["model"])
    data = batches(base, rounds + 1, size)
    engines = {name: ds_hetero.initialize(copy.deepcopy(base), config(*ROWS[name])) for name in rows}
    times = {name: [] for name in rows}
    first_loss, bytes_ = {}, {}
    for k in range(rounds + 1):
        order = rows if k % 2 == 0 else rows[::-1]
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            result = engines[name].train_batch(data[k])
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if k == 0:
                first_loss[name] = result.loss
            else:  # step 0 warms up (first calls, allocations)
                times[name].append(float(elapsed))
                # all ranks' bytes of every exchange this rank is in: rank 0 holds the language
                # stage in every row, so it is in every encoder's exchanges
                bytes_[name] = (int(result.boundary_bytes_total), int(result.boundary_bytes_lower_bound))
    return {"times": times, "first_loss": first_loss, "bytes": bytes_}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8, help="timed rounds (after one warm-up round)")
    p.add_argument("--quick", action="store_true", help="tiny sizes")
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    a = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from ds_hetero.testing.launch import run_distributed

    start = time.perf_counter()
    results = run_distributed(_run, world_size=4, timeout=3600, rounds=a.rounds, quick=a.quick, rows=a.rows)
    r = results[0]
    ref = a.rows[0]
    print(f"\nQwen2.5-Omni thinker ({'quick' if a.quick else 'default'} sizes), 4 gloo ranks, "
          f"{a.rounds} interleaved rounds, {time.perf_counter() - start:.0f} s in all (machine shared: read ratios)\n")
    head = f"{'row':12s} {'median step s':>13s} {'ratio to ' + ref:>22s} {'first loss':>11s} " \
           f"{'boundary fwd B/step':>20s} {'lower bound':>12s} {'sent/bound':>10s}"
    print(head)
    print("-" * len(head))
    for name in a.rows:
        ratios = [t / b for t, b in zip(r["times"][name], r["times"][ref])]
        total, bound = r["bytes"][name]
        print(f"{name:12s} {statistics.median(r['times'][name]):13.4f} {statistics.median(ratios):22.3f} "
              f"{r['first_loss'][name]:11.6f} {total:20d} {bound:12d} {total / max(bound, 1):10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
