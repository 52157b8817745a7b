"""The MoE VLM with its encoder in the LLM's layout (a single-layout system) against heterogeneous
layouts (the encoder at plain dp, the language with expert parallelism), interleaved in one run.

    .venv/bin/python benchmarks/bench_moe.py                  # 2 ranks, one bound per core, then 4 ranks (two per core)
    .venv/bin/python benchmarks/bench_moe.py --world 2 --quick

Model: tiny-qwen3-vl-moe scaled up to take a measurable step on CPU (families/qwen3_vl_moe/tiny.py's
builder: 8 experts, top-2, every decoder layer MoE, the aux loss on; sizes below), fp32, AdamW, ZeRO 1,
clipping 1.0; every sample one image of 16x16 patches (64 image tokens) and text.

Rows (ds_hetero configs, all colocated, the language always dp x ep):
    single layout   the encoder forced into the experts' layout: its dp is the ep-folded dp (cp x dp / ep,
                    the expert-data-parallel size) and the ep ranks become its model-parallel (tp) group,
                    so vision tp = ep, dp = world / ep. What a system with one layout for the whole model
                    does when the LLM's ranks are cut into ep groups (as bench_layouts' homogeneous row
                    expresses Megatron's layout with ds_hetero configs)
    heterogeneous   the encoder at plain dp over every rank (tp 1), the language as above

Every row's engine lives in the same processes; steps go round-robin (A B, B A, ...), so a shared
machine's drift hits both rows alike; the median of the per-round ratios is the speedup. After the
timed rounds, one more step per row records the routing (a wrapper around the expert layers' router,
not timed): the dispatch bytes sent to other ranks (every (token, expert) assignment whose expert lives
on another ep rank, as the dropless all-to-all sends them) against their lower bound (each token sent
once per remote rank it needs, however many of that rank's experts it picks) and the planner's
balanced figure (tokens x top_k x hidden x (ep-1)/ep), and the expert load: assignments per ep rank,
max / mean, per layer. The first-step loss must be equal on both rows (same model and batches).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_ranks import launch  # noqa: E402

SIZES = dict(text_hidden=256, text_layers=4, vision_hidden=256, vision_depth=6, num_experts=8, top_k=2)
QUICK = dict(text_hidden=64, text_layers=2, vision_hidden=64, vision_depth=2, num_experts=8, top_k=2)
GRID, TEXT, BATCH = (1, 16, 16), 32, 8


def rows_for(world: int) -> list[tuple[str, dict]]:
    out = []
    for ep in (e for e in (2, 4) if world % e == 0 and e <= world):
        lang = {"tp": 1, "dp": world, "ep": ep}
        out.append((f"single ep{ep}", {"vision": {"tp": ep, "dp": world // ep}, "language": lang}))
        out.append((f"hetero ep{ep}", {"vision": {"tp": 1, "dp": world}, "language": lang}))
    return out


def build(sizes):
    from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe

    return tiny_qwen3_vl_moe(seed=3, **sizes)


def batches(model, n):
    from ds_hetero.testing.batches import qwen_samples

    return [qwen_samples(model, [GRID] * BATCH, text_len=TEXT, seed=1000 + i) for i in range(n)]


class Recorder:
    """Wraps an expert layer's router: per call, this rank's assignments per destination ep rank."""

    def __init__(self, layer, calls):
        from ds_hetero.expert_parallel.dispatch import route

        self.layer, self.calls, self.route = layer, calls, route

    def __call__(self, top_k_index, num_experts):
        import torch

        local = self.layer.num_local_experts
        dest = top_k_index // local  # [T, k] ep rank of each assignment
        remote = dest != self.layer.ep_rank
        per_token = torch.zeros(top_k_index.shape[0], self.layer.ep_size, dtype=torch.bool)
        per_token.scatter_(1, dest, True)
        per_token[:, self.layer.ep_rank] = False
        counts = torch.bincount(top_k_index.reshape(-1), minlength=num_experts)
        self.calls.append(dict(sent=int(remote.sum()), bound=int(per_token.sum()), tokens=int(top_k_index.shape[0]),
                               counts=counts.tolist(), ep=self.layer.ep_size, local=local))
        return self.route(top_k_index, num_experts)


def record_routing(engine, samples):
    from ds_hetero.expert_parallel import ExpertParallelExperts

    calls = []
    layers = [m for m in engine.stages.language.module.modules() if isinstance(m, ExpertParallelExperts)]
    for m in layers:
        m.router = Recorder(m, calls)
    engine.train_batch(samples)
    for m in layers:
        m.router = m.router.route
    return calls, len(layers)


def run(rank, world, sizes, rounds, warmup, pin):
    import torch
    import torch.distributed as dist

    import ds_hetero

    if pin:  # one rank per core (or as evenly as the cores allow): a waiting rank's core stays idle
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    model = build(sizes)
    cfg = lambda stages: {"train_batch_size": BATCH, "zero_optimization": {"stage": 1}, "gradient_clipping": 1.0,
                          "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
                          "hetero_parallel": {"placement": "colocated", "micro_batches": 1, "stages": stages}}
    # torch's AdamW as the client optimizer (as the tests do): a DS "optimizer" section would build
    # DeepSpeed's CPU Adam extension on first use
    opt = lambda params: torch.optim.AdamW(params, lr=1e-4)
    names = [n for n, _ in rows_for(world)]
    engines = {n: ds_hetero.initialize(copy.deepcopy(model), cfg(st), optimizer=opt) for n, st in rows_for(world)}
    data = batches(model, warmup + rounds + 1)
    times, first = {n: [] for n in names}, {}
    for i, samples in enumerate(data[:-1]):
        for n in (names if i % 2 == 0 else names[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            r = engines[n].train_batch(samples)
            wall = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # the step is the slowest rank's
            first.setdefault(n, r.loss)
            if i >= warmup:
                times[n].append(float(wall))
    routing = {n: record_routing(engines[n], data[-1]) for n in names}
    return dict(times=times, first=first, routing=routing, affinity=sorted(os.sched_getaffinity(0)))


def routing_figures(per_rank, name, hidden, dtype_bytes=4):
    """(bytes sent to other ranks, their lower bound, the planner's balanced figure, load max/mean per
    layer: (mean over layers, worst)) of one row's recorded step, all ranks together."""
    calls = [c for r in per_rank for c in r["routing"][name][0]]
    n_layers = per_rank[0]["routing"][name][1]
    sent = sum(c["sent"] for c in calls) * hidden * dtype_bytes
    bound = sum(c["bound"] for c in calls) * hidden * dtype_bytes
    ep = calls[0]["ep"]
    balanced = sum(c["tokens"] for c in calls) * SIZES_K[0] * hidden * dtype_bytes * (ep - 1) / ep
    world = len(per_rank)
    ratios = []
    for layer in range(n_layers):  # each rank calls its layers in order: call layer, layer + L, ...
        for group_start in range(0, world, ep):  # ep groups: consecutive dp ranks (tp 1, cp 1)
            counts = [0] * len(calls[0]["counts"])
            for r in range(group_start, group_start + ep):
                for e, c in enumerate(per_rank[r]["routing"][name][0][layer]["counts"]):
                    counts[e] += c
            local = calls[0]["local"]
            loads = [sum(counts[i * local:(i + 1) * local]) for i in range(ep)]
            ratios.append(max(loads) / (sum(loads) / ep))
    return sent, bound, balanced, (statistics.mean(ratios), max(ratios))


SIZES_K = [2]  # top-k of the run (set in main)


def report(world, per_rank, sizes, load):
    names = list(per_rank[0]["times"])
    times = per_rank[0]["times"]
    print(f"\n== {world} ranks (affinity per rank: {[r['affinity'] for r in per_rank]}), load average {load}")
    print(f"{'row':<12} {'median step':>12} {'min':>8} {'loss@1':>10} {'dispatch sent':>14} {'lower bound':>12} "
          f"{'sent/bound':>10} {'planner bal.':>13} {'load max/mean':>14} {'worst':>6}")
    for n in names:
        sent, bound, bal, (mean_ratio, worst) = routing_figures(per_rank, n, sizes["text_hidden"])
        print(f"{n:<12} {statistics.median(times[n]):>11.3f}s {min(times[n]):>7.3f}s {per_rank[0]['first'][n]:>10.5f} "
              f"{sent / 2**20:>12.2f}MB {bound / 2**20:>10.2f}MB {sent / bound if bound else 0:>10.2f} "
              f"{bal / 2**20:>11.2f}MB {mean_ratio:>14.2f} {worst:>6.2f}")
    for ep in sorted({n.split("ep")[1] for n in names}):
        a, b = times[f"single ep{ep}"], times[f"hetero ep{ep}"]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        print(f"ep{ep}: single layout / heterogeneous, median of per-round ratios: {ratio:.3f} "
              f"(> 1: heterogeneous faster); ratio of the fastest steps {min(a) / min(b):.3f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    sizes = QUICK if args.quick else SIZES
    SIZES_K[0] = sizes["top_k"]
    print(f"model: tiny-qwen3-vl-moe {sizes}; batch {BATCH} samples of one {GRID} image "
          f"({GRID[1] * GRID[2] // 4} image tokens) + {TEXT} text tokens; {os.cpu_count()} CPUs", flush=True)
    for world in args.world:
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        per_rank = launch(run, sizes, args.rounds, args.warmup, True, world=world, timeout=3000.0)
        load = f"{load0:.1f} -> {os.getloadavg()[0]:.1f}"
        report(world, per_rank, sizes, load)
        print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
