"""Homogeneous vs heterogeneous layouts of one LLaVA on 4 ranks, and ds_hetero vs plain DeepSpeed.

    python recipes/bench_layouts.py            # default sizes, ~3-5 min on 2 idle CPU cores
    python recipes/bench_layouts.py --quick    # tiny sizes, ~1 min
    python recipes/bench_layouts.py --profile  # + where the time goes (torch.profiler, one step)

One run launches a fresh set of 4 gloo processes per row (so each row's peak memory is its own),
builds the same seeded LLaVA (CLIP tower, 576 image tokens per sample by default, a vision tower
about the size of the language model, as in LLaVA training where the encoder sees 576 tokens per
image) and trains it on the same global batches of the synthetic shapes-captioning data:

    homogeneous      vision tp2 dp2, language tp2 dp2  (the encoder forced into the LLM's layout)
    hetero tp2       vision tp1 dp4, language tp2 dp2
    hetero tp4       vision tp1 dp4, language tp4 dp1
    ds_hetero dp4    vision tp1 dp4, language tp1 dp4  (dp only: what plain DeepSpeed can also run)
    plain DS dp4     one deepspeed.initialize over the whole LlavaForConditionalGeneration, dp4

Every ds_hetero row goes through the same HeteroEngine (`ds_hetero.initialize`, ZeRO 1, AdamW,
global-norm clipping 1.0); the plain row uses the same DeepSpeed config, optimizer, clipping,
objective (sum of token losses / global label tokens) and samples per rank. Then all rows run
once more in ONE set of 4 processes holding every row's engine, stepping them round-robin
(A B C D E, E D C B A, ...), so the drift of a shared machine hits every row alike; the medians
of the per-round ratios are the speedups and the plugin-overhead figure (ds_hetero dp4 / plain
DeepSpeed dp4).

Reported per row: median step time (per step the slowest rank, after warm-up), label tokens/s
and all tokens/s (text + image placeholders), peak memory per rank (max RSS from
resource.getrusage(RUSAGE_SELF).ru_maxrss, which includes the loaded libraries; "+over start"
subtracts the RSS measured before the model was built, psutil), per-stage time split
(rank mean of the medians), boundary bytes per step (all ranks, forward + backward), and ratios
to the homogeneous row. The first-step loss must be equal on every row (same model, same batches,
same objective): a cheap check that every row trains the same function.

On a 2-core machine the 4 ranks are oversubscribed (one thread each, two per core), so absolute
times are low and noisy: read the ratios, and on a machine shared with other jobs prefer the
interleaved table (and its ratios of fastest steps) to the per-row table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import resource
import statistics
import tempfile
import time
import traceback
from collections import defaultdict
from datetime import timedelta

WORLD = 4
PRELOAD = ["torch", "torch.distributed", "deepspeed", "transformers"]

LAYOUTS = {  # row name -> (vision (tp, dp), language (tp, dp)); None = plain DeepSpeed
    "homogeneous": ((2, 2), (2, 2)),
    "hetero tp2": ((1, 4), (2, 2)),
    "hetero tp4": ((1, 4), (4, 1)),
    "ds_hetero dp4": ((1, 4), (1, 4)),
    "plain DS dp4": None,
}
BASELINE = "homogeneous"

DEFAULTS = dict(image_size=96, patch_size=4, vision_hidden=256, vision_layers=4, vision_heads=8,
                text_hidden=256, text_layers=4, text_heads=8, text_kv_heads=4,
                batch=8, micro_batches=1, warmup=2, steps=5, rounds=6)
QUICK = dict(image_size=32, patch_size=4, vision_hidden=64, vision_layers=2, vision_heads=4,
             text_hidden=64, text_layers=2, text_heads=4, text_kv_heads=4,
             batch=8, micro_batches=1, warmup=1, steps=3, rounds=3)


# ----------------------------------------------------------------------------- model, data, configs
def build_model(a):
    from ds_hetero.models.tiny import tiny_llava

    return tiny_llava("clip", seed=a["seed"], text_hidden=a["text_hidden"], text_layers=a["text_layers"],
                      text_heads=a["text_heads"], text_kv_heads=a["text_kv_heads"], vocab=256,
                      vision_hidden=a["vision_hidden"], vision_layers=a["vision_layers"],
                      vision_heads=a["vision_heads"], image_size=a["image_size"], patch_size=a["patch_size"])


def make_batches(model, a, n):
    """n global batches (lists of samples), identical on every rank."""
    from ds_hetero.data import ShapesCaptionDataset

    data = ShapesCaptionDataset.for_llava(model.config, size=n * a["batch"], seed=a["seed"] + 1,
                                          max_shapes=2, grid=3)
    return [[data[i * a["batch"] + j] for j in range(a["batch"])] for i in range(n)]


def ds_config(a, layout=None):
    cfg = {
        "train_batch_size": a["batch"],
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if layout is None:  # plain DeepSpeed, dp over the whole world
        cfg["gradient_accumulation_steps"] = a["micro_batches"]
        cfg["train_micro_batch_size_per_gpu"] = a["batch"] // (WORLD * a["micro_batches"])
    else:
        (vtp, vdp), (ltp, ldp) = layout
        cfg["hetero_parallel"] = {"placement": "colocated", "micro_batches": a["micro_batches"], "stages": {
            "vision": {"tp": vtp, "dp": vdp}, "language": {"tp": ltp, "dp": ldp}}}
    return cfg


class PlainEngine:
    """One deepspeed.initialize over the whole HF model, trained on the same objective as ds_hetero."""

    def __init__(self, model, a):
        import deepspeed
        import torch.distributed as dist

        from ds_hetero.engine import ensure_distributed
        from ds_hetero.models import adapter_for, split_llava

        self.rank, self.world = ensure_distributed(600)
        self.a, self.adapter = a, adapter_for(model)
        stages = split_llava(model)  # only to list the parameters LLaVA's forward uses (see trainable_parameters)
        params = stages["vision"].trainable_parameters() + [p for p in stages["language"].parameters()]
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config(a))
        self.dist = dist

    def train_batch(self, samples):
        import torch

        from ds_hetero.loss import label_token_count, token_loss_sum

        a, gas = self.a, self.a["micro_batches"]
        n_labels = sum(label_token_count(s["labels"]) for s in samples)
        per_rank = a["batch"] // (self.world * gas)
        times = defaultdict(float)
        loss_sum = 0.0
        start = time.perf_counter()
        for m in range(gas):  # the same samples per rank and micro-batch as ds_hetero's dp4 stages
            first = m * (a["batch"] // gas) + self.rank * per_rank
            mine = samples[first:first + per_rank]
            t0 = time.perf_counter()
            batch = self.adapter.language_inputs(mine)
            logits = self.engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 position_ids=batch["position_ids"],
                                 pixel_values=self.adapter.vision_inputs(mine)["pixel_values"]).logits
            local = token_loss_sum(logits, batch["labels"])
            t1 = time.perf_counter()
            self.engine.backward(local / n_labels * (self.world * gas))
            t2 = time.perf_counter()
            self.engine.step()
            t3 = time.perf_counter()
            loss_sum += float(local.detach())
            times["forward"] += t1 - t0
            times["backward"] += t2 - t1
            times["step"] += t3 - t2
        loss = torch.tensor([loss_sum], dtype=torch.float64)
        self.dist.all_reduce(loss)
        return dict(loss=float(loss) / n_labels, num_tokens=n_labels, step_time=time.perf_counter() - start,
                    stage_time={"model": {"forward": times["forward"], "backward": times["backward"]},
                                "optimizer": {"step": times["step"]}},
                    boundary_bytes=0)


def make_engine(name, a):
    import ds_hetero

    model = build_model(a)
    layout = LAYOUTS[name]
    if layout is None:
        return model, PlainEngine(model, a)
    return model, ds_hetero.initialize(model, ds_config(a, layout))


def as_record(result):
    if isinstance(result, dict):
        return result
    return dict(loss=result.loss, num_tokens=result.num_tokens, step_time=result.step_time,
                stage_time=result.stage_time, boundary_bytes=result.boundary_bytes)


def timed_step(engine, samples):
    import torch.distributed as dist

    dist.barrier()  # every rank starts the step together
    t0 = time.perf_counter()
    rec = as_record(engine.train_batch(samples))
    rec["wall"] = time.perf_counter() - t0
    return rec


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
               start_rss=start_rss, tokens=sum(int(s["input_ids"].numel()) for s in batches[0]))
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
    times = {n: [] for n in names}
    for i, samples in enumerate(batches):
        order = names if i % 2 == 0 else names[::-1]  # no row always goes first
        for n in order:
            rec = timed_step(engines[n][1], samples)
            if i >= a["warmup"]:
                times[n].append(rec["wall"])
    return times


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


# ----------------------------------------------------------------------------- launcher
def _child(fn, rank, store, args, results):
    try:
        import warnings

        import torch
        import torch.distributed as dist

        # DeepSpeed 0.19's ZeRO calls the renamed all_gather_into_tensor on every step
        warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
        torch.set_num_threads(1)  # 4 ranks share the cores; more threads only contend
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_SIZE=str(WORLD),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", DS_ACCELERATOR="cpu")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=600))
        value = fn(rank, WORLD, *args)
        dist.destroy_process_group()
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001 - the parent prints it
        results.put((rank, "error", traceback.format_exc()))


def launch(fn, *args, timeout=1200.0):
    """fn(rank, WORLD, *args) on 4 fresh processes (forked from a preloaded forkserver); per-rank results."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="bench_layouts_") as tmp:
        procs = [ctx.Process(target=_child, args=(fn, r, os.path.join(tmp, "store"), args, results), daemon=True)
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        out, deadline = {}, time.monotonic() + timeout
        try:
            while len(out) < WORLD:
                try:
                    rank, status, value = results.get(timeout=0.5)
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode not in (None, 0)]
                    if dead or time.monotonic() > deadline:
                        raise RuntimeError(f"ranks {dead or 'all'} died or timed out")
                    continue
                if status == "error":
                    raise RuntimeError(f"rank {rank} failed:\n{value}")
                out[rank] = value
        finally:
            for p in procs:
                if p.is_alive():
                    p.join(timeout=5 if len(out) == WORLD else 0)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [out[r] for r in range(WORLD)]


# ----------------------------------------------------------------------------- summary and table
def summarize(name, per_rank, a):
    steps = len(per_rank[0]["records"])
    walls = [max(r["records"][i]["wall"] for r in per_rank) for i in range(steps)]
    median = statistics.median(walls)
    split = defaultdict(float)
    for r in per_rank:
        for s, p in {(s, p) for rec in r["records"] for s, ph in rec["stage_time"].items() for p in ph}:
            key = s if s == "optimizer" else f"{s}.{p}"  # the optimizer's phase name varies by engine
            split[key] += statistics.median(rec["stage_time"].get(s, {}).get(p, 0.0)
                                            for rec in r["records"]) / WORLD
    labels = per_rank[0]["records"][0]["num_tokens"]
    return dict(
        name=name, layout=LAYOUTS[name], step_s=median, step_min=min(walls), step_max=max(walls),
        label_tok_s=labels / median, all_tok_s=per_rank[0]["tokens"] / median,
        peak_rss=[r["peak_rss"] for r in per_rank], start_rss=[r["start_rss"] for r in per_rank],
        split=dict(split), first_loss=per_rank[0]["first_loss"],
        boundary_bytes=statistics.median(sum(r["records"][i]["boundary_bytes"] for r in per_rank)
                                         for i in range(steps)),
        profile=[r.get("profile") for r in per_rank],
    )


def layout_str(layout):
    if layout is None:
        return "whole model dp4"
    (vtp, vdp), (ltp, ldp) = layout
    return f"V tp{vtp}dp{vdp} L tp{ltp}dp{ldp}"


def print_table(rows, paired, a):
    base = next((r for r in rows if r["name"] == BASELINE), rows[0])
    print()
    print(f"model: LLaVA (CLIP {a['vision_layers']}x{a['vision_hidden']}, {a['image_size']}px/{a['patch_size']} -> "
          f"{(a['image_size'] // a['patch_size']) ** 2} image tokens; Llama {a['text_layers']}x{a['text_hidden']}); "
          f"{a['vision_params'] / 1e6:.2f}M vision + {a['text_params'] / 1e6:.2f}M language params; "
          f"global batch {a['batch']}, micro_batches {a['micro_batches']}, ZeRO 1, fp32, AdamW")
    print(f"{WORLD} CPU ranks (gloo, 1 thread each) on {os.cpu_count()} cores; "
          f"median of {a['steps']} steps after {a['warmup']} warm-up, per step the slowest rank")
    head = (f"{'row':<14} {'layout':<20} {'step s':>7} {'min-max':>11} {'label tok/s':>11} {'all tok/s':>9} "
            f"{'peak RSS MB/rank':>22} {'+over start':>11} {'boundary MB':>11} {'speedup':>7} {'loss@1':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        rss = "/".join(f"{x:.0f}" for x in r["peak_rss"])
        delta = max(p - s for p, s in zip(r["peak_rss"], r["start_rss"]))
        print(f"{r['name']:<14} {layout_str(r['layout']):<20} {r['step_s']:>7.2f} "
              f"{r['step_min']:>5.2f}-{r['step_max']:<5.2f} {r['label_tok_s']:>11.1f} {r['all_tok_s']:>9.0f} "
              f"{rss:>22} {delta:>11.0f} {r['boundary_bytes'] / 2**20:>11.2f} "
              f"{base['step_s'] / r['step_s']:>6.2f}x {r['first_loss']:>8.4f}")
    print("speedup = homogeneous step time / row step time; +over start = max over ranks of peak RSS minus RSS "
          "before the model was built; boundary MB = all ranks, forward + backward, per step")
    print()
    def rank_of(word, order):
        return order.index(word) if word in order else len(order)

    phases = sorted({k for r in rows for k in r["split"]}, key=lambda k: (
        rank_of(k.split(".")[0], ["vision", "boundary", "language", "model", "optimizer"]),
        rank_of(k.partition(".")[2], ["forward", "rows", "grads", "backward"]), k))
    print("per-stage time split, seconds per step (rank mean of per-rank medians):")
    print(f"{'row':<14} " + " ".join(f"{p:>17}" for p in phases) + f" {'sum':>7}")
    for r in rows:
        print(f"{r['name']:<14} " + " ".join(f"{r['split'].get(p, float('nan')):>17.3f}" for p in phases)
              + f" {sum(r['split'].values()):>7.3f}")
    if any(r["profile"][0] for r in rows):
        print()
        print("profile of one extra step (torch.profiler self CPU time, seconds, rank mean; collectives include "
              "time blocked waiting for peers):")
        for r in rows:
            b = defaultdict(float)
            for prof in r["profile"]:
                for k, v in prof["buckets"].items():
                    b[k] += v / WORLD
            top = ", ".join(f"{k} {v:.2f}" for k, v in r["profile"][0]["top"][:4])
            print(f"{r['name']:<14} " + "  ".join(f"{k} {v:.2f}" for k, v in sorted(b.items()))
                  + f"   | rank 0 top: {top}")
    if paired:
        print()
        n = len(next(iter(paired.values())))
        print(f"interleaved: every row's engine in ONE set of 4 processes, round-robin steps ({n} rounds after "
              f"{a['warmup']} warm-up), per step the slowest rank; ratios are per round, then the median")
        ref = paired.get(BASELINE)
        print(f"{'row':<14} {'layout':<20} {'median s':>8} {'min s':>6} {'speedup vs homog.':>17} {'(by min)':>8}")
        for name, ts in paired.items():
            sp = (f"{statistics.median(r / t for r, t in zip(ref, ts)):>16.2f}x {min(ref) / min(ts):>7.2f}x"
                  if ref else f"{'-':>17} {'-':>8}")
            print(f"{name:<14} {layout_str(LAYOUTS[name]):<20} {statistics.median(ts):>8.3f} {min(ts):>6.3f} {sp}")
        print("(by min): ratio of the fastest steps; contention from other jobs only adds time, so on a shared "
              "machine the minimum is the steadier estimate")
        if "ds_hetero dp4" in paired and "plain DS dp4" in paired:
            h, p = paired["ds_hetero dp4"], paired["plain DS dp4"]
            ratios = [x / y for x, y in zip(h, p)]
            print(f"plugin overhead: ds_hetero dp4 / plain DeepSpeed dp4 step time, median of per-round ratios "
                  f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}), "
                  f"of fastest steps {min(h) / min(p):.3f}; median {statistics.median(h):.3f} s vs "
                  f"{statistics.median(p):.3f} s; target <= 1.05")


def run_benchmark(a, rows=None, interleaved=True, log=print):
    """Each row in fresh processes, then all of them interleaved; returns (summaries, interleaved, a)."""
    model = build_model(a)
    from ds_hetero.models import split_llava

    stages = split_llava(model)
    a = dict(a, vision_params=sum(p.numel() for p in stages["vision"].parameters()),
             text_params=sum(p.numel() for p in stages["language"].parameters()))
    del model, stages
    summaries = []
    for name in [n for n in LAYOUTS if n in (rows or LAYOUTS)]:
        t0 = time.perf_counter()
        s = summarize(name, launch(run_row, name, a), a)
        summaries.append(s)
        log(f"[{time.perf_counter() - t0:5.1f}s] {name:<14} step {s['step_s']:.2f}s  loss@1 {s['first_loss']:.4f}",
            flush=True)
    pair = None
    if interleaved and a["rounds"] > 0:
        t0 = time.perf_counter()
        names = [n for n in LAYOUTS if n in (rows or LAYOUTS)]
        per_rank = launch(run_interleaved, names, a)
        pair = {n: [max(r[n][i] for r in per_rank) for i in range(len(per_rank[0][n]))] for n in names}
        log(f"[{time.perf_counter() - t0:5.1f}s] interleaved rows done", flush=True)
    return summaries, pair, a


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny model and few steps (~1 min)")
    p.add_argument("--profile", action="store_true", help="profile one extra step per row (torch.profiler)")
    p.add_argument("--rows", nargs="+", choices=list(LAYOUTS), help="only these rows (default: all)")
    p.add_argument("--no-interleaved", action="store_true", help="skip the interleaved phase")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results here")
    for k, v in DEFAULTS.items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=None,
                       help=f"default {v} ({QUICK[k]} with --quick)")
    args = p.parse_args(argv)
    a = dict(QUICK if args.quick else DEFAULTS)
    a.update({k: getattr(args, k) for k in DEFAULTS if getattr(args, k) is not None})
    a.update(seed=args.seed, profile=args.profile)
    if a["batch"] % (WORLD * a["micro_batches"]):
        p.error(f"--batch must be divisible by {WORLD} x --micro-batches")
    return args, a


def main(argv=None):
    args, a = parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    t0 = time.perf_counter()
    rows, pair, a = run_benchmark(a, args.rows, interleaved=not args.no_interleaved)
    print_table(rows, pair, a)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": a, "rows": rows, "interleaved": pair}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
