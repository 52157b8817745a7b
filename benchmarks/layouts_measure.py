"""bench_layouts' measurement: what each rank runs (one row in fresh processes, or every row's engine
interleaved in one set of processes), the per-step record (wall and CPU seconds, memory, phase
times, an optional profile), and the summary of a row over its steps and ranks."""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections import defaultdict

from cpu_ranks import launch
from layouts_plain import PlainEngine, PlainTwoEngines
from layouts_rows import (LAYOUTS, Plain, build_model, ds_config, layout_of, make_batches, mb_of, rank_groups,
                          with_param_counts)


def make_engine(name, a):
    import ds_hetero

    model = build_model(a)
    layout = layout_of(name, a)
    if isinstance(layout, Plain):
        return model, (PlainTwoEngines if layout.two_engines else PlainEngine)(model, a, layout, ds_config(a, layout))
    engine = ds_hetero.initialize(model, ds_config(a, layout))
    engine.timeline.synchronize = True  # the time split per phase is the benchmark's: time the device work
    return model, engine


def as_record(result):
    if isinstance(result, dict):
        return result
    return dict(loss=result.loss, num_tokens=result.num_tokens, step_time=result.step_time,
                stage_time=result.stage_time, boundary_bytes=result.boundary_bytes,
                busy=result.busy_time, bubble=result.bubble_fraction)


def timed_step(engine, samples):
    """One step from a common start (barrier); wall and CPU seconds of this process (all its threads).

    CPU time is what the rank really got from the cores: a rank blocked in a gloo collective does
    not spin (it sleeps), so its core goes to the other ranks.
    """
    import torch.distributed as dist

    dist.barrier()  # every rank starts the step together
    t0, c0 = time.perf_counter(), time.process_time()
    rec = as_record(engine.train_batch(samples))
    rec["wall"], rec["cpu"] = time.perf_counter() - t0, time.process_time() - c0
    return rec


def held_params(model, engine):
    """Parameters this rank holds (its tp shards; a disaggregated rank's other stage is on meta)."""
    # stages sharing one engine (stages/shared_engine.py) list it under each name: count it once
    engines = {id(e): e for e in engine.engines.values()} if hasattr(engine, "engines") else {}
    modules = [e.module for e in engines.values()] or [model]
    return sum(p.numel() for m in modules for p in m.parameters() if p.device.type != "meta")


def rss_mb():
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ----------------------------------------------------------------------------- what each rank runs
def run_row(rank, world, name, a):
    """One layout: build, warm up, time `steps` steps; optionally profile one more."""
    import torch

    start_rss = rss_mb()
    model, engine = make_engine(name, a)
    batches = make_batches(model, a, a["warmup"] + a["steps"] + int(a["profile"]))
    records = [timed_step(engine, s) for s in batches[:a["warmup"] + a["steps"]]]
    out = dict(records=records[a["warmup"]:], first_loss=records[0]["loss"], peak_rss=peak_rss_mb(),
               start_rss=start_rss, tokens=sum(int(s["input_ids"].numel()) for s in batches[0]),
               params=held_params(model, engine))
    if a["profile"]:
        out["profile"] = profile_step(engine, batches[-1])
    del engine, model
    torch.distributed.barrier()
    return out


def run_interleaved(rank, world, names, a):
    """All rows' engines in one set of processes, round-robin steps (A B C .. then reversed order).

    A shared machine drifts (other jobs come and go); within a round every row sees about the same
    conditions, so per-round ratios are fairer than comparing rows measured minutes apart.
    """
    engines = {n: make_engine(n, a) for n in names}
    model = engines[names[0]][0]
    batches = make_batches(model, a, a["warmup"] + a["rounds"])
    times, first_loss = {n: [] for n in names}, {}
    for i, samples in enumerate(batches):
        order = names if i % 2 == 0 else names[::-1]  # no row always goes first
        for n in order:
            rec = timed_step(engines[n][1], samples)
            first_loss.setdefault(n, rec["loss"])
            if i >= a["warmup"]:
                times[n].append(rec["wall"])
    return times, first_loss


# Collectives as the profiler sees them: c10d/gloo ops, DeepSpeed's comm records, and ds_hetero's
# differentiable collectives (their Python forward/backward blocks in the wait, so the time lands
# in the autograd Function's own event rather than in a c10d child).
COMM_MARKERS = ("gloo:", "c10d::", "record_param_comms", "_CopyToRegion", "_ReduceFromRegion", "_AllGather",
                "_ReduceScatter", "_GatherFromRegion", "_SplitToRegion", "_AllToAll", "_BoundaryExchange",
                "_VocabParallelCrossEntropy")


def profile_step(engine, samples):
    """Self CPU time of one step by op, folded into compute / collectives / other (this rank)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        timed_step(engine, samples)
    buckets = defaultdict(float)
    top = defaultdict(float)
    for e in prof.key_averages():
        t = e.self_cpu_time_total / 1e6
        top[e.key] += t
        if any(m in e.key for m in COMM_MARKERS):
            buckets["collectives"] += t
        elif e.key.startswith(("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product",
                               "aten::_flash_attention", "aten::linear", "aten::matmul")):
            buckets["matmul+attention"] += t
        else:
            buckets["other ops"] += t
    torch.distributed.barrier()
    return dict(buckets=dict(buckets), top=sorted(top.items(), key=lambda kv: -kv[1])[:6])

def flat_times(rec):
    """{"vision.forward": s, "boundary.rows": s, "optimizer": s, ...} of one step record."""
    out = {}
    for s, phases in rec["stage_time"].items():
        for p, t in phases.items():
            key = s if s == "optimizer" else f"{s}.{p}"  # the optimizer's phases (norm, step) summed
            out[key] = out.get(key, 0.0) + t
    return out


def summarize(name, per_rank, a):
    steps = len(per_rank[0]["records"])
    at = [[r["records"][i] for r in per_rank] for i in range(steps)]  # at[step][rank]
    walls = [max(x["wall"] for x in recs) for recs in at]
    cpus = [sum(x["cpu"] for x in recs) for recs in at]
    median = statistics.median(walls)
    cores = len(os.sched_getaffinity(0))
    med = statistics.median
    groups = {}
    for label, ranks in rank_groups(name, a["world"]):  # time split per rank set doing the same work
        g = defaultdict(float)
        for r in ranks:
            recs = per_rank[r]["records"]
            for key in {k for rec in recs for k in flat_times(rec)}:
                g[key] += med(flat_times(rec).get(key, 0.0) for rec in recs) / len(ranks)
        groups[label] = dict(
            ranks=ranks, split=dict(g), cpu=med(med(rec["cpu"] for rec in per_rank[r]["records"]) for r in ranks),
            bubble=(med(med(rec["bubble"] for rec in per_rank[r]["records"]) for r in ranks)
                    if "bubble" in per_rank[ranks[0]]["records"][0] else None))
    labels = per_rank[0]["records"][0]["num_tokens"]
    return dict(
        name=name, layout=LAYOUTS[name], micro_batches=mb_of(name, a),
        step_s=median, step_min=min(walls), step_max=max(walls),
        label_tok_s=labels / median, all_tok_s=per_rank[0]["tokens"] / median,
        cpu_s=med(cpus), util=med(c / (w * cores) for c, w in zip(cpus, walls)),
        bubble=[med(rec["bubble"] for rec in r["records"]) if "bubble" in r["records"][0] else None
                for r in per_rank],
        peak_rss=[r["peak_rss"] for r in per_rank], start_rss=[r["start_rss"] for r in per_rank],
        params=[r["params"] for r in per_rank], groups=groups, first_loss=per_rank[0]["first_loss"],
        boundary_bytes=med(sum(r["records"][i]["boundary_bytes"] for r in per_rank) for i in range(steps)),
        profile=[r.get("profile") for r in per_rank],
    )


def run_benchmark(a, rows=None, interleaved=True, log=print, fresh=None):
    """Each row (or only those in `fresh`) in fresh processes, then all of them interleaved.

    Returns (summaries, interleaved step times per row, a); a["interleaved_loss"] holds each row's
    first-step loss in the interleaved phase.
    """
    a = with_param_counts(a)
    names = [n for n in LAYOUTS if n in (rows or LAYOUTS)]
    names += [n for n in (rows or []) if n not in LAYOUTS and n in a.get("extra_layouts", {})]
    summaries = []
    for name in [n for n in names if fresh is None or n in fresh]:
        t0 = time.perf_counter()
        s = summarize(name, launch(run_row, name, a, world=a["world"]), a)
        summaries.append(s)
        log(f"[{time.perf_counter() - t0:5.1f}s] {name:<15} step {s['step_s']:.2f}s  loss@1 {s['first_loss']:.4f}",
            flush=True)
    pair = None
    if interleaved and a["rounds"] > 0:
        t0 = time.perf_counter()
        per_rank = launch(run_interleaved, names, a, world=a["world"])
        pair = {n: [max(r[0][n][i] for r in per_rank) for i in range(len(per_rank[0][0][n]))] for n in names}
        a["interleaved_loss"] = per_rank[0][1]
        log(f"[{time.perf_counter() - t0:5.1f}s] interleaved rows done", flush=True)
    return summaries, pair, a
