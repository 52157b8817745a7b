"""The encoder's straggler: position vs token balancing, one vs several encoder passes, 4 ranks, one run.

    .venv/bin/python benchmarks/bench_balance.py              # Qwen2-VL, 0/64/256/1024 and Zipf-like image tokens
    .venv/bin/python benchmarks/bench_balance.py --quick      # a quarter of the tokens, fewer steps (~3 min loaded)
    .venv/bin/python benchmarks/bench_balance.py --video      # video clips beside images, from the plan alone (1 s)

Image-token counts per sample are skewed (a text-only sample next to one with 1024 image tokens),
so the vision stage's dp rank that gets the big images by position is the straggler every rank
waits for. Rows (all colocated, vision tp1 dp4 + language tp1 dp4, global batch 16, 2 language
micro-batches, ZeRO 1, AdamW, clipping 1.0):

    position      hetero_parallel.balance "position": each vision rank encodes its samples' images
    tokens        balance "tokens": images to ranks by cost, LPT (ds_hetero/step/balance.py)
    position 1p   position, the vision stage in one pass per step (stages.vision.micro_batches 1)
    tokens 1p     tokens, one vision pass per step

and, with --disaggregated, vision dp2 on ranks 0-1 + language dp2 on 2-3 (position, tokens).

All rows' engines live in ONE set of 4 gloo processes and step round-robin on the same batches
(A B C D, D C B A, ...), so the drift of a shared machine hits every row alike. Reported per row
and distribution: the vision stage's max/mean image tokens per rank and max/mean cost
(models/item_cost.py transformer_cost; worst micro-batch), the slowest vision rank's forward time and its
forward + backward time (the backward includes waiting in the boundary's backward exchange),
the step time (slowest rank), boundary bytes per step (== the lower bound of the row's
placement, checked) and the ratios to the "position" row. Medians over the timed rounds.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_ranks import launch  # noqa: E402  (4 fresh gloo processes from a preloaded forkserver)

ROWS = {  # name: (vision stage, language stage, vision micro-batches or None, balance)
    "position": ({"dp": 4}, {"dp": 4}, None, "position"),
    "tokens": ({"dp": 4}, {"dp": 4}, None, "tokens"),
    "position 1p": ({"dp": 4}, {"dp": 4}, 1, "position"),
    "tokens 1p": ({"dp": 4}, {"dp": 4}, 1, "tokens"),
}
DISAGGREGATED = {
    "disagg position": ({"dp": 2}, {"dp": 2}, None, "position"),
    "disagg tokens": ({"dp": 2}, {"dp": 2}, None, "tokens"),
}


def image_tokens(dist: str, n: int, scale: int, seed: int) -> list[int]:
    """Image tokens per sample: 'skewed' cycles 0/64/256/1024 (shuffled), 'zipf' draws 1024/k^1.3."""
    rng = random.Random(seed)
    if dist == "skewed":
        out = [t // scale for t in [0, 64, 256, 1024] * (n // 4)]
        rng.shuffle(out)
        return out
    out = []
    for _ in range(n):
        k = rng.randint(1, 16)
        t = int(1024 / k**1.3) // scale
        out.append(0 if k > 12 else max(4, t - t % 4))  # a quarter text-only
    return out


def grid_of(tokens: int) -> tuple[int, int, int] | None:
    """A Qwen2-VL image grid (t, h, w) with tokens = h * w / 4 (as square as possible)."""
    if tokens == 0:
        return None
    patches = tokens * 4
    h = 2 * max(d for d in range(1, int(tokens**0.5) + 1) if tokens % d == 0)
    return (1, h, patches // h)


def make_model(a):
    from ds_hetero.toy import tiny_qwen2_vl

    return tiny_qwen2_vl(seed=0, text_hidden=a.text_hidden, vision_embed=a.vision_embed, vision_depth=a.vision_depth)


def batches(model, dist: str, a, n: int):
    from ds_hetero.testing.uneven import qwen_uneven

    out = []
    for step in range(n):
        tokens = image_tokens(dist, a.batch, a.scale, seed=1000 * step + (dist == "zipf"))
        out.append(qwen_uneven(model, [[grid_of(t)] if t else None for t in tokens], text_len=24, seed=step))
    return out


def config(row, a, disaggregated):
    vision, language, vision_mbs, balance = row
    vision = dict(vision, **({"micro_batches": vision_mbs} if vision_mbs else {}))
    return {
        "train_batch_size": a.batch, "zero_optimization": {"stage": 1}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
        "hetero_parallel": {"placement": "disaggregated" if disaggregated else "colocated",
                            "micro_batches": 2, "balance": balance,
                            "stages": {"vision": vision, "language": language}},
    }


def run(rank, world, rows, a):
    """Every row's engine on these 4 ranks; round-robin timed steps over both distributions."""
    import time

    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.step.balance import encoder_assignment

    engines = {}
    for name, (row, disagg) in rows.items():
        engines[name] = ds_hetero.initialize(make_model(a), config(row, a, disagg))
    out = {}
    for dist_name in ("skewed", "zipf"):
        data = batches(engines[next(iter(rows))].model, dist_name, a, a.warmup + a.rounds)
        rec = {n: [] for n in rows}
        for i, samples in enumerate(data):
            order = list(rows) if i % 2 == 0 else list(rows)[::-1]
            for n in order:
                engine = engines[n]
                dist.barrier()
                t0 = time.perf_counter()
                r = engine.train_batch(samples)
                wall = time.perf_counter() - t0
                if i < a.warmup:
                    continue
                cfg = engine.config
                assign = [encoder_assignment(cfg, engine.adapter, samples, "vision", v)
                          for v in range(cfg.micro_batches_of("vision"))]
                vision = r.stage_time.get("vision", {})
                rec[n].append(dict(
                    wall=wall, loss=r.loss, bytes=r.boundary_bytes_total, bound=r.boundary_bytes_lower_bound,
                    tok_ratio=max(x.imbalance("rows") for x in assign),
                    cost_ratio=max(x.imbalance("cost") for x in assign),
                    max_tokens=max(max(x.loads("rows")) for x in assign),
                    v_fwd=vision.get("forward", 0.0), v_all=vision.get("forward", 0.0) + vision.get("backward", 0.0)))
        out[dist_name] = rec
    for e in engines.values():
        e.groups.destroy()
    return out


def summarize(per_rank, rows):
    """Per distribution and row: medians over rounds of the slowest rank's times; pure figures from rank 0."""
    table = {}
    for dist_name in per_rank[0]:
        for n in rows:
            steps = list(zip(*(r[dist_name][n] for r in per_rank)))  # per round: every rank's record
            first = [s[0] for s in steps]
            assert all(x["bytes"] == x["bound"] for s in steps for x in s), "boundary bytes above the lower bound"

            def slowest(key):
                return statistics.median(max(x[key] for x in s) for s in steps)

            table[dist_name, n] = dict(
                tok_ratio=max(x["tok_ratio"] for x in first), cost_ratio=max(x["cost_ratio"] for x in first),
                max_tokens=max(x["max_tokens"] for x in first), v_fwd=slowest("v_fwd"), v_all=slowest("v_all"),
                step=slowest("wall"), bytes=statistics.median(x["bytes"] for x in first),
                loss=first[0]["loss"])
    return table


def print_table(table, rows, a):
    print(f"\nQwen2-VL (vision embed {a.vision_embed} x {a.vision_depth} blocks, text {a.text_hidden}), 4 ranks, "
          f"global batch {a.batch}, 2 language micro-batches, image tokens / {a.scale}; medians of {a.rounds} rounds")
    head = ("dist", "row", "tok max/mean", "cost max/mean", "max tok/rank", "vision fwd s", "vision f+b s",
            "step s", "step vs position", "vision f+b vs pos", "boundary KiB")
    lines = [head]
    for (d, n), r in table.items():
        base = table[d, "disagg position" if n.startswith("disagg") else "position"]
        lines.append((d, n, f"{r['tok_ratio']:.2f}", f"{r['cost_ratio']:.2f}", str(r["max_tokens"]),
                      f"{r['v_fwd']:.3f}", f"{r['v_all']:.3f}", f"{r['step']:.3f}",
                      f"{base['step'] / r['step']:.2f}x", f"{base['v_all'] / r['v_all']:.2f}x",
                      f"{r['bytes'] / 1024:.0f}"))
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    for k, line in enumerate(lines):
        print("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a quarter of the image tokens, 1 warm-up, 2 rounds")
    p.add_argument("--disaggregated", action="store_true", help="add vision dp2 + language dp2 on disjoint ranks")
    p.add_argument("--video", action="store_true", help="only the video mix's plans (video_balance.py): no processes")
    p.add_argument("--rows", nargs="+", choices=list(ROWS) + list(DISAGGREGATED), help="a subset of rows")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--vision-embed", type=int, default=64)
    p.add_argument("--vision-depth", type=int, default=4)
    p.add_argument("--text-hidden", type=int, default=64)
    a = p.parse_args(argv)
    a.scale = 4 if a.quick else 1
    a.warmup = a.warmup if a.warmup is not None else 1
    a.rounds = a.rounds if a.rounds is not None else (2 if a.quick else 4)
    return a


def main(argv=None):
    a = parse_args(argv)
    if a.video:
        from video_balance import video_table

        return video_table()
    rows = {n: (r, False) for n, r in ROWS.items()}
    if a.disaggregated:
        rows.update({n: (r, True) for n, r in DISAGGREGATED.items()})
    if a.rows:
        rows = {n: v for n, v in {**{n: (r, False) for n, r in ROWS.items()},
                                  **{n: (r, True) for n, r in DISAGGREGATED.items()}}.items() if n in a.rows}
    table = summarize(launch(run, rows, a, timeout=3600.0), rows)
    print_table(table, rows, a)
    return table


if __name__ == "__main__":
    main()
