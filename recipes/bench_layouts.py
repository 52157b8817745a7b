"""Homogeneous, colocated heterogeneous and disaggregated layouts of one LLaVA on 4 ranks, in one run.

    python recipes/bench_layouts.py                       # both scenarios, ~5 min on 2 CPU cores
    python recipes/bench_layouts.py --quick               # tiny sizes, ~1.5 min
    python recipes/bench_layouts.py --scenario wide-vision   # a tower large in parameters (~3.5 min)
    python recipes/bench_layouts.py --rows "hetero tp4" "plain DS dp4" ...   # any rows of LAYOUTS
    python recipes/bench_layouts.py --profile             # + where the time goes (torch.profiler, one step)

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
import multiprocessing as mp
import os
import queue
import resource
import statistics
import tempfile
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

WORLD = 4
PRELOAD = ["torch", "torch.distributed", "deepspeed", "transformers"]


@dataclass(frozen=True)
class Layout:
    """One ds_hetero row: (tp, dp) per stage; disaggregated rows also name each stage's ranks."""

    vision: tuple[int, int]
    language: tuple[int, int]
    placement: str = "colocated"
    vision_ranks: tuple[int, ...] | None = None
    language_ranks: tuple[int, ...] | None = None
    mb: int | None = None  # micro-batches of this row only (default: see micro_batches)

    @property
    def disaggregated(self) -> bool:
        return self.placement == "disaggregated"

    def micro_batches(self, a) -> int:
        """Colocated rows run --micro-batches (1: no pipeline to fill); disaggregated rows pipeline
        --pipeline-micro-batches (a two-stage 1F1B needs >= 2 to overlap anything)."""
        if self.mb is not None:
            return self.mb
        return a["pipeline_micro_batches"] if self.disaggregated else a["micro_batches"]

    def rank_groups(self) -> list[tuple[str, tuple[int, ...]]]:
        """(label, ranks) of the rank sets that do different work: all ranks, or one set per stage."""
        if not self.disaggregated:
            return [("all", tuple(range(WORLD)))]
        return [("vision", self.vision_ranks), ("language", self.language_ranks)]


@dataclass(frozen=True)
class Plain:
    """Plain DeepSpeed over the whole model: dp over all ranks, or DeepSpeed's own AutoTP
    (`"tensor_parallel": {"autotp_size": autotp}`), which shards the language model only and
    leaves the vision tower and projector replicated on the tp ranks."""

    autotp: int = 1

    @property
    def dp(self) -> int:
        return WORLD // self.autotp


LAYOUTS = {  # row name -> Layout, or Plain for plain DeepSpeed over the whole model
    "homogeneous": Layout((2, 2), (2, 2)),
    "homogeneous tp4": Layout((4, 1), (4, 1)),  # both stages at the language's tp4
    "hetero tp2": Layout((1, 4), (2, 2)),
    "hetero tp4": Layout((1, 4), (4, 1)),
    "ds_hetero dp4": Layout((1, 4), (1, 4)),
    "hetero Vtp4": Layout((4, 1), (1, 4)),
    "hetero tp2 mb4": Layout((1, 4), (2, 2), mb=4),  # colocated controls for the pipelined rows
    "hetero dp4 mb4": Layout((1, 4), (1, 4), mb=4),
    "plain DS dp4": Plain(),
    "DS AutoTP tp2": Plain(autotp=2),
    # disaggregated: each rank holds one stage; the vision ranks encode micro-batch m+1 while the
    # language ranks run forward + backward of m
    "disagg 2+2 tp": Layout((1, 2), (2, 1), "disaggregated", (0, 1), (2, 3)),
    "disagg 2+2 dp": Layout((1, 2), (1, 2), "disaggregated", (0, 1), (2, 3)),
    "disagg 2+2 Vtp2": Layout((2, 1), (1, 2), "disaggregated", (0, 1), (2, 3)),
    "disagg 3+1": Layout((1, 3), (1, 1), "disaggregated", (0, 1, 2), (3,)),  # needs --batch 12 or 24
    "disagg 1+3": Layout((1, 1), (1, 3), "disaggregated", (0,), (1, 2, 3)),
}
BASELINE = "homogeneous"

DEFAULTS = dict(image_size=64, patch_size=4, vision_hidden=256, vision_layers=4, vision_heads=8,
                text_hidden=256, text_layers=4, text_heads=8, text_kv_heads=4,
                batch=16, micro_batches=1, pipeline_micro_batches=4, warmup=2, steps=4, rounds=6)
QUICK = dict(image_size=32, patch_size=4, vision_hidden=64, vision_layers=2, vision_heads=4,
             text_hidden=64, text_layers=2, text_heads=4, text_kv_heads=4,
             batch=16, micro_batches=1, pipeline_micro_batches=4, warmup=1, steps=3, rounds=3)

# One run = one or more scenarios (a model size and the rows that run on it). Each scenario's sizes
# override DEFAULTS (or QUICK); explicit size flags override both.
COMPARE = ["homogeneous", "hetero tp2", "ds_hetero dp4", "hetero tp2 mb4", "disagg 2+2 tp", "disagg 2+2 dp"]
SCENARIOS = {
    "balanced": dict(
        about="vision tower about the language model's size and compute",
        sizes={}, quick_sizes={}, rows=COMPARE),
    "large-vision": dict(
        about="vision tower 2x the language model's parameters, 2.25x its compute per token",
        sizes=dict(vision_hidden=384), quick_sizes=dict(vision_hidden=128), rows=COMPARE),
    # not in the default run: a tower large in parameters for the few tokens it sees (64 per image),
    # where the work that scales with a replica's parameters (gradient reduction, optimizer) dominates
    "wide-vision": dict(
        about="vision tower 12x the language model's parameters, 64 image tokens per sample",
        sizes=dict(image_size=32, vision_hidden=768, vision_layers=6, vision_heads=12),
        quick_sizes=dict(image_size=16, vision_hidden=256, vision_layers=4),
        rows=["homogeneous", "hetero tp2", "ds_hetero dp4", "hetero Vtp4", "disagg 2+2 dp", "disagg 2+2 Vtp2"]),
}
DEFAULT_SCENARIOS = ["balanced", "large-vision"]


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


def ds_config(a, layout=Plain()):
    cfg = {
        "train_batch_size": a["batch"],
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if isinstance(layout, Plain):  # plain DeepSpeed, dp over the whole world (or AutoTP x dp)
        cfg["gradient_accumulation_steps"] = a["micro_batches"]
        cfg["train_micro_batch_size_per_gpu"] = a["batch"] // (layout.dp * a["micro_batches"])
        if layout.autotp > 1:
            cfg["tensor_parallel"] = {"autotp_size": layout.autotp}
            # DeepSpeed checks train_batch_size against the whole world (tp ranks included) before
            # AutoTP splits it; micro-batch and accumulation steps say the same without that check
            del cfg["train_batch_size"]
    else:
        stages = {}
        for name, (tp, dp), ranks in (("vision", layout.vision, layout.vision_ranks),
                                      ("language", layout.language, layout.language_ranks)):
            stages[name] = {"tp": tp, "dp": dp} | ({"ranks": list(ranks)} if ranks else {})
        cfg["hetero_parallel"] = {"placement": layout.placement, "micro_batches": layout.micro_batches(a),
                                  "stages": stages}
    return cfg


class PlainEngine:
    """One deepspeed.initialize over the whole HF model, trained on the same objective as ds_hetero."""

    def __init__(self, model, a, plain=Plain()):
        import deepspeed
        import torch.distributed as dist

        from ds_hetero.topology.distributed import ensure_distributed
        from ds_hetero.models import adapter_for, split_llava

        self.rank, self.world = ensure_distributed(600)
        self.a, self.adapter = a, adapter_for(model)
        stages = split_llava(model)  # only to list the parameters LLaVA's forward uses (see trainable_parameters)
        params = stages["vision"].trainable_parameters() + [p for p in stages["language"].parameters()]
        self.plain = plain
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config(a, plain))
        self.dist = dist

    def train_batch(self, samples):
        import torch

        from ds_hetero.loss import label_token_count, token_loss_sum

        a, gas = self.a, self.a["micro_batches"]
        n_labels = sum(label_token_count(s["labels"]) for s in samples)
        dp = self.plain.dp  # AutoTP: the tp ranks of a group (consecutive ranks) take the same samples
        per_rank = a["batch"] // (dp * gas)
        times = defaultdict(float)
        loss_sum = 0.0
        start = time.perf_counter()
        for m in range(gas):  # the same samples per rank and micro-batch as ds_hetero's dp4 stages
            first = m * (a["batch"] // gas) + (self.rank // self.plain.autotp) * per_rank
            mine = samples[first:first + per_rank]
            t0 = time.perf_counter()
            batch = self.adapter.language_inputs(mine)
            logits = self.engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 position_ids=batch["position_ids"],
                                 pixel_values=self.adapter.vision_inputs(mine)["pixel_values"]).logits
            local = token_loss_sum(logits, batch["labels"])
            t1 = time.perf_counter()
            self.engine.backward(local / n_labels * (dp * gas))
            t2 = time.perf_counter()
            self.engine.step()
            t3 = time.perf_counter()
            loss_sum += float(local.detach()) / self.plain.autotp  # every tp rank computed the same loss
            times["forward"] += t1 - t0
            times["backward"] += t2 - t1
            times["step"] += t3 - t2
        loss = torch.tensor([loss_sum], dtype=torch.float64)
        self.dist.all_reduce(loss)
        return dict(loss=float(loss) / n_labels, num_tokens=n_labels, step_time=time.perf_counter() - start,
                    stage_time={"model": {"forward": times["forward"], "backward": times["backward"]},
                                "optimizer": {"step": times["step"]}},
                    boundary_bytes=0)


def layout_of(name, a):
    """A row of LAYOUTS, or one a caller added for this run (a["extra_layouts"], e.g. a planner's pick)."""
    return a.get("extra_layouts", {}).get(name) or LAYOUTS[name]


def make_engine(name, a):
    import ds_hetero

    model = build_model(a)
    layout = layout_of(name, a)
    if isinstance(layout, Plain):
        return model, PlainEngine(model, a, layout)
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
    modules = [e.module for e in engine.engines.values()] if hasattr(engine, "engines") else [model]
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


# ----------------------------------------------------------------------------- launcher
def _child(fn, rank, store, args, results, world=None):
    global WORLD
    if world is not None:  # the parent's world size (a caller may change WORLD before launching)
        WORLD = world
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
    """fn(rank, WORLD, *args) on WORLD (4) fresh processes (forked from a preloaded forkserver); per-rank results."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="bench_layouts_") as tmp:
        procs = [ctx.Process(target=_child, args=(fn, r, os.path.join(tmp, "store"), args, results, WORLD),
                             daemon=True) for r in range(WORLD)]
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
def flat_times(rec):
    """{"vision.forward": s, "boundary.rows": s, "optimizer": s, ...} of one step record."""
    out = {}
    for s, phases in rec["stage_time"].items():
        for p, t in phases.items():
            key = s if s == "optimizer" else f"{s}.{p}"  # the optimizer's phases (norm, step) summed
            out[key] = out.get(key, 0.0) + t
    return out


def rank_groups(name):
    layout = LAYOUTS[name]
    return [("all", tuple(range(WORLD)))] if isinstance(layout, Plain) else layout.rank_groups()


def summarize(name, per_rank, a):
    steps = len(per_rank[0]["records"])
    at = [[r["records"][i] for r in per_rank] for i in range(steps)]  # at[step][rank]
    walls = [max(x["wall"] for x in recs) for recs in at]
    cpus = [sum(x["cpu"] for x in recs) for recs in at]
    median = statistics.median(walls)
    cores = len(os.sched_getaffinity(0))
    med = statistics.median
    groups = {}
    for label, ranks in rank_groups(name):  # time split per rank set doing the same work
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


def mb_of(name, a):
    layout = LAYOUTS[name]
    return a["micro_batches"] if isinstance(layout, Plain) else layout.micro_batches(a)


def ranks_str(ranks):
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def layout_str(layout):
    if isinstance(layout, Plain):
        return f"whole model dp{layout.dp}" + (f" AutoTP{layout.autotp}" if layout.autotp > 1 else "")
    (vtp, vdp), (ltp, ldp) = layout.vision, layout.language
    if layout.disaggregated:
        return f"V tp{vtp}dp{vdp}@{ranks_str(layout.vision_ranks)} L tp{ltp}dp{ldp}@{ranks_str(layout.language_ranks)}"
    return f"V tp{vtp}dp{vdp} L tp{ltp}dp{ldp}"


SHORT = {"vision.forward": "V fwd", "vision.backward": "V bwd", "boundary.rows": "bnd rows",
         "boundary.grads": "bnd grads", "boundary.combine": "bnd sync", "language.forward": "L fwd", "language.backward": "L bwd",
         "model.forward": "fwd", "model.backward": "bwd", "optimizer": "optim"}


def print_table(rows, paired, a, scenario=None):
    base = next((r for r in rows if r["name"] == BASELINE), rows[0])
    cores = len(os.sched_getaffinity(0))
    print()
    if scenario:
        print(f"== scenario {scenario}: {SCENARIOS[scenario]['about'] if scenario in SCENARIOS else ''}")
    print(f"model: LLaVA (CLIP {a['vision_layers']}x{a['vision_hidden']}, {a['image_size']}px/{a['patch_size']} -> "
          f"{(a['image_size'] // a['patch_size']) ** 2} image tokens; Llama {a['text_layers']}x{a['text_hidden']}); "
          f"{a['vision_params'] / 1e6:.2f}M vision + {a['text_params'] / 1e6:.2f}M language params; "
          f"global batch {a['batch']}, ZeRO 1, fp32, AdamW")
    print(f"{WORLD} CPU ranks (gloo, 1 thread each) on {cores} cores; median of {a['steps']} steps after "
          f"{a['warmup']} warm-up, per step the slowest rank; mb = micro-batches (gradient accumulation; "
          f"disaggregated rows pipeline them)")
    head = (f"{'row':<15} {'layout':<26} {'mb':>2} {'step s':>6} {'min-max':>11} {'tok/s':>6} {'tok/s/rank':>10} "
            f"{'label tok/s':>11} {'vs homog.':>9} {'bubble %/rank':>15} {'CPU s':>6} {'util':>5} {'loss@1':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        bub = "/".join(f"{100 * b:.0f}" for b in r["bubble"]) if r["bubble"][0] is not None else "-"
        print(f"{r['name']:<15} {layout_str(r['layout']):<26} {r['micro_batches']:>2} {r['step_s']:>6.2f} "
              f"{r['step_min']:>5.2f}-{r['step_max']:<5.2f} {r['all_tok_s']:>6.0f} {r['all_tok_s'] / WORLD:>10.0f} "
              f"{r['label_tok_s']:>11.1f} {base['step_s'] / r['step_s']:>8.2f}x {bub:>15} {r['cpu_s']:>6.2f} "
              f"{r['util']:>5.2f} {r['first_loss']:>8.4f}")
    print("tok/s = all tokens (text + image placeholders) per second, /rank = over the 4 ranks; vs homog. = "
          "homogeneous step time / row step time (= the tokens/s ratio); bubble = 1 - busy / step time per rank "
          "(StepResult.bubble_fraction: time outside forward, backward and optimizer, i.e. waiting at the "
          f"boundary); CPU s = CPU seconds per step, all ranks; util = CPU s / (step s x {cores} cores)")
    print()
    head = (f"{'row':<15} {'params M/rank':>23} {'peak RSS MB/rank':>23} {'+over start MB/rank':>23} "
            f"{'max +over':>9} {'vs homog.':>9} {'boundary MB':>11}")
    print(head)
    print("-" * len(head))
    def over(r):
        return [p - s for p, s in zip(r["peak_rss"], r["start_rss"])]
    for r in rows:
        print(f"{r['name']:<15} {'/'.join(f'{x / 1e6:.2f}' for x in r['params']):>23} "
              f"{'/'.join(f'{x:.0f}' for x in r['peak_rss']):>23} "
              f"{'/'.join(f'{x:.0f}' for x in over(r)):>23} {max(over(r)):>9.0f} "
              f"{max(over(r)) / max(over(base)):>8.2f}x {r['boundary_bytes'] / 2**20:>11.2f}")
    print("params = parameters each rank holds (tp shards; a disaggregated rank holds one stage); "
          "peak RSS = max RSS of each rank's process (includes the libraries); +over start = peak minus the RSS "
          "before the model was built (every rank first builds the whole model; disaggregated ranks then move the "
          "other stage to the meta device); boundary MB = all ranks, forward + backward, per step")
    print()

    def rank_of(word, order):
        return order.index(word) if word in order else len(order)

    phases = sorted({k for r in rows for g in r["groups"].values() for k in g["split"]}, key=lambda k: (
        rank_of(k.split(".")[0], ["vision", "boundary", "language", "model", "optimizer"]),
        rank_of(k.partition(".")[2], ["forward", "rows", "grads", "backward"]), k))
    print("time split, seconds per step on each rank set (mean over its ranks of per-rank medians); busy = forward "
          "+ backward + optimizer; CPU = CPU seconds per rank and step:")
    head = (f"{'row':<15} {'ranks':<12} " + " ".join(f"{SHORT.get(p, p):>9}" for p in phases)
            + f" {'busy':>6} {'CPU':>6} {'bubble':>6} {'step':>6}")
    print(head)
    for r in rows:
        for label, g in r["groups"].items():
            busy = sum(v for k, v in g["split"].items() if not k.startswith("boundary"))
            bub = f"{100 * g['bubble']:>5.0f}%" if g["bubble"] is not None else f"{'-':>6}"
            print(f"{r['name']:<15} {label + ' ' + ranks_str(g['ranks']):<12} "
                  + " ".join(f"{g['split'][p]:>9.3f}" if p in g["split"] else f"{'':>9}" for p in phases)
                  + f" {busy:>6.3f} {g['cpu']:>6.3f} {bub} {r['step_s']:>6.2f}")
    print("bnd rows / bnd grads: boundary exchanges, including the wait for the other rank set (colocated: the "
          "gradient exchange runs inside V bwd)")
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
            print(f"{r['name']:<15} " + "  ".join(f"{k} {v:.2f}" for k, v in sorted(b.items()))
                  + f"   | rank 0 top: {top}")
    if paired:
        print()
        n = len(next(iter(paired.values())))
        print(f"interleaved: every row's engine in ONE set of 4 processes, round-robin steps ({n} rounds after "
              f"{a['warmup']} warm-up), per step the slowest rank; ratios are per round, then the median")
        ref = paired.get(BASELINE)
        print(f"{'row':<15} {'layout':<26} {'mb':>2} {'median s':>8} {'min s':>6} {'speedup vs homog.':>17} "
              f"{'(by min)':>8}")
        for name, ts in paired.items():
            sp = (f"{statistics.median(r / t for r, t in zip(ref, ts)):>16.2f}x {min(ref) / min(ts):>7.2f}x"
                  if ref else f"{'-':>17} {'-':>8}")
            print(f"{name:<15} {layout_str(LAYOUTS[name]):<26} {mb_of(name, a):>2} {statistics.median(ts):>8.3f} "
                  f"{min(ts):>6.3f} {sp}")
        print("(by min): ratio of the fastest steps; contention from other jobs only adds time, so on a shared "
              "machine the minimum is the steadier estimate")
        if "ds_hetero dp4" in paired and "plain DS dp4" in paired:
            h, p = paired["ds_hetero dp4"], paired["plain DS dp4"]
            ratios = [x / y for x, y in zip(h, p)]
            print(f"plugin overhead: ds_hetero dp4 / plain DeepSpeed dp4 step time, median of per-round ratios "
                  f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}), "
                  f"of fastest steps {min(h) / min(p):.3f}; median {statistics.median(h):.3f} s vs "
                  f"{statistics.median(p):.3f} s; target <= 1.05")


def with_param_counts(a):
    from ds_hetero.models import split_llava

    model = build_model(a)
    stages = split_llava(model)
    return dict(a, vision_params=sum(p.numel() for p in stages["vision"].parameters()),
                text_params=sum(p.numel() for p in stages["language"].parameters()))


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
        s = summarize(name, launch(run_row, name, a), a)
        summaries.append(s)
        log(f"[{time.perf_counter() - t0:5.1f}s] {name:<15} step {s['step_s']:.2f}s  loss@1 {s['first_loss']:.4f}",
            flush=True)
    pair = None
    if interleaved and a["rounds"] > 0:
        t0 = time.perf_counter()
        per_rank = launch(run_interleaved, names, a)
        pair = {n: [max(r[0][n][i] for r in per_rank) for i in range(len(per_rank[0][0][n]))] for n in names}
        a["interleaved_loss"] = per_rank[0][1]
        log(f"[{time.perf_counter() - t0:5.1f}s] interleaved rows done", flush=True)
    return summaries, pair, a


def batch_problems(a, names):
    """Rows whose stages cannot split the global batch into dp x micro-batches evenly."""
    out = []
    for n in names:
        layout = LAYOUTS[n]
        stages = ([("model", (layout.autotp, layout.dp))] if isinstance(layout, Plain)
                  else [("vision", layout.vision), ("language", layout.language)])
        for stage, (_, dp) in stages:
            if a["batch"] % (dp * mb_of(n, a)):
                out.append(f"{n}: {stage} dp{dp} x mb{mb_of(n, a)} does not divide --batch {a['batch']}")
    return out


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
