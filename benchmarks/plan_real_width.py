"""Real widths on this machine: Qwen2-VL-2B's widths (2 layers each) on 2 pinned CPU ranks, measured
against `ds-hetero plan --price CONFIG --machine calibrate`.

    .venv/bin/python benchmarks/plan_real_width.py                      # 2 repetitions, 3 timed steps each
    .venv/bin/python benchmarks/plan_real_width.py --repeats 1 --steps 2 --layouts "V tp2 L tp2"

The model is ds_configs/planner/qwen2vl_2b_2layers.json: Qwen2-VL-2B's language widths (hidden
1536, intermediate 8960, 12 heads, 2 kv heads, the full 151936-token vocabulary, tied embeddings)
and its 675M ViT's (embed_dim 1280, 16 heads, mlp_ratio 4, patch 14, spatial merge 2, the merger
to 1536), with 2 decoder layers and 2 ViT blocks; seeded random weights, fp32, about 0.4 B
parameters. Every sample is one 224x224 image (a 16x16 patch grid: 256 ViT tokens, 64 image tokens
after the merge) and text to exactly --seq-len tokens; global batch 2, one micro-batch, ZeRO 1,
AdamW (torch), clipping 1.0. Two layouts (LAYOUTS), each run in its own 2 fresh gloo processes, each
rank bound to its own core (os.sched_setaffinity) with one thread:

    V dp2 L tp2    the vision stage data-parallel, the language tensor-parallel (colocated)
    V tp2 L tp2    both stages tensor-parallel

A repetition calibrates the machine (`machine_profile("calibrate", refresh=True)`, the profile
`--machine calibrate` caches) and prices both layouts with it (planner/price.py, what `--price`
prints), then runs the layouts one after the other; the next repetition calibrates again and runs
them in the reverse order, so that a shared machine's drift reaches both rows alike and each
prediction uses a calibration taken minutes before its measurement.

Measured per rank: wall seconds per step (a barrier before each; the slowest rank's, median over the
timed steps), the CPU seconds the rank got in it (below the wall time when other work shares its
core), the bytes it touched for the first time (minor page faults x page size: what the cost
model's `first touch` prices), and memory from the kernel's resident-set counters: `base` the process after its
imports (interpreter, torch, DeepSpeed, transformers: what a GPU's CUDA context is to
max_memory_allocated, and not priced), `peak` the high-water mark VmHWM over the timed steps (reset
through /proc/self/clear_refs after the warm-up step, whose optimizer state is then allocated), and
`peak - base` held against the planner's peak bytes per rank. Goals: memory within 10%, step time
within 25%, and the two layouts in the same order predicted as measured (docs/planner.md, "Real
widths on this machine").

Diagnostics: `--trace-memory` samples the resident set through one more step and prints the most
held in each timeline span (where the peak is); `--profile` the top operators of one more step on
rank 0; `--reprice RUN.json` prices an earlier `--json` run's measurements again with the current
cost model and the calibration each repetition took (no training).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_ranks import launch  # noqa: E402  (fresh gloo processes from a preloaded forkserver)
from process_memory import reset_peak, status_kib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "ds_configs", "planner", "qwen2vl_2b_2layers.json")
WORLD = 2
LAYOUTS = {  # row name: (vision stage, language stage)
    "V dp2 L tp2": ({"tp": 1, "dp": 2}, {"tp": 2, "dp": 1}),
    "V tp2 L tp2": ({"tp": 2, "dp": 1}, {"tp": 2, "dp": 1}),
}
GRID = (1, 16, 16)  # a 224x224 image at patch 14: 16x16 patches, 64 tokens after the 2x2 merge
IGNORE = -100


def ds_config(layout: str, batch: int) -> dict:
    vision, language = LAYOUTS[layout]
    return {
        "train_batch_size": batch, "zero_optimization": {"stage": 1}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
        "hetero_parallel": {"micro_batches": 1, "stages": {"vision": vision, "language": language}},
    }


def hf_config():
    from ds_hetero.planner.model_source import load_hf_config

    return load_hf_config(MODEL)


def image_tokens(cfg) -> int:
    t, h, w = GRID
    return t * h * w // cfg.vision_config.spatial_merge_size**2


def make_samples(cfg, batch: int, seq: int, seed: int) -> list[dict]:
    """`batch` samples of exactly `seq` tokens: <vision_start> 64 image placeholders <vision_end> text."""
    import torch

    v = cfg.vision_config
    t, h, w = GRID
    n = image_tokens(cfg)
    patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size**2
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batch):
        text = torch.randint(1000, 150000, (seq - n - 2,), generator=gen)  # clear of the special ids
        ids = torch.cat([torch.tensor([cfg.vision_start_token_id]), torch.full((n,), cfg.image_token_id),
                         torch.tensor([cfg.vision_end_token_id]), text])
        labels = torch.cat([torch.full((n + 2,), IGNORE), text])
        pixels = torch.randn(t * h * w, patch_dim, generator=gen)
        out.append({"input_ids": ids, "labels": labels, "pixel_values": pixels, "image_grid_thw": torch.tensor([GRID])})
    return out


def run_layout(rank, world, layout, batch, seq, steps, profile=False, trace_memory=False):
    """One layout on this rank, bound to its own core: per-step wall seconds and the memory counters."""
    import torch
    import torch.distributed as dist
    from transformers import Qwen2VLForConditionalGeneration

    import ds_hetero

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    gc.collect()
    base = status_kib("VmRSS") * 1024
    cfg = hf_config()
    torch.manual_seed(0)
    engine = ds_hetero.initialize(Qwen2VLForConditionalGeneration(cfg), ds_config(layout, batch), seed=0)
    built = status_kib("VmRSS") * 1024
    data = [make_samples(cfg, batch, seq, seed=s) for s in range(steps + 1)]
    first = engine.train_batch(data[0])  # warm-up: the optimizer's state is allocated here
    reset_peak()
    settled = status_kib("VmRSS") * 1024
    walls, cpus, phases, faults = [], [], [], []
    for samples in data[1:]:
        dist.barrier()
        t0, c0, f0 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        result = engine.train_batch(samples)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)  # what the rank got from its core (a wait in gloo sleeps)
        # pages touched for the first time (fresh allocations the C library maps and unmaps each step)
        faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) * resource.getpagesize())
        phases.append(result.stage_time)
    peak = status_kib("VmHWM") * 1024
    top = profile_step(engine, data[-1], rank == 0) if profile else None  # every rank steps; rank 0 records
    spans = memory_by_span(engine, data[-1], base) if trace_memory else None
    engine.groups.destroy()
    return {"walls": walls, "cpus": cpus, "phases": phases, "fresh": faults, "base": base, "built": built,
            "settled": settled, "peak": peak, "loss": first.loss, "profile": top, "spans": spans}


def memory_by_span(engine, samples, base, every_s=0.005):
    """One more step with the resident set sampled every `every_s` from a thread: the most memory
    (above `base`) held during each of the step's timeline spans (a stage's forward, backward, the
    optimizer ...) and between them."""
    import threading

    samples_rss, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            samples_rss.append((time.time(), status_kib("VmRSS") * 1024 - base))
            time.sleep(every_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    step = engine.global_steps
    engine.train_batch(samples)
    stop.set()
    sampler.join()
    spans = sorted(engine.timeline.step_spans(step), key=lambda s: s.start)
    out = []
    for s in spans:
        inside = [m for t, m in samples_rss if s.start <= t <= s.end]
        out.append((s.name, round(s.end - s.start, 3), max(inside) if inside else None))
    out.append(("whole step", None, max(m for _, m in samples_rss)))
    return out


def profile_step(engine, samples, record: bool, n=25):
    """Self CPU seconds of one more step by operator, the largest n (on the rank that records)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    if not record:
        engine.train_batch(samples)
        dist.barrier()
        return None
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        engine.train_batch(samples)
    dist.barrier()
    rows = [(e.key, str(e.input_shapes)[:90], e.count, e.self_cpu_time_total / 1e6)
            for e in prof.key_averages(group_by_input_shape=True)]
    return sorted(rows, key=lambda r: -r[3])[:n]


def predict(layout, batch, seq, machine, cfg):
    from ds_hetero.planner.price import price

    return price(MODEL, ds_config(layout, batch), WORLD, seq, machine, image_tokens=image_tokens(cfg))


def summarize(per_rank) -> dict:
    steps = len(per_rank[0]["walls"])
    walls = [max(r["walls"][i] for r in per_rank) for i in range(steps)]  # the slowest rank's step
    return {"step_s": statistics.median(walls), "walls": walls,
            "peak": [r["peak"] for r in per_rank], "base": [r["base"] for r in per_rank],
            "held": [r["peak"] - r["base"] for r in per_rank], "settled": [r["settled"] - r["base"] for r in per_rank],
            "built": [r["built"] - r["base"] for r in per_rank], "loss": per_rank[0]["loss"],
            "cpu_s": [statistics.median(r["cpus"]) for r in per_rank],
            "fresh": [statistics.median(r["fresh"]) for r in per_rank], "phases": [r["phases"][-1] for r in per_rank],
            "profile": per_rank[0]["profile"], "spans": per_rank[0]["spans"]}


def _phases(stage_time) -> str:
    return "; ".join(f"{s}: " + ", ".join(f"{k} {v:.2f}" for k, v in d.items()) for s, d in stage_time.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2, help="calibrate + both layouts, order reversed each time")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=2, help="global batch (samples per step)")
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    p.add_argument("--profile", action="store_true", help="profile one more step on rank 0 (top operators)")
    p.add_argument("--trace-memory", action="store_true", help="one more step with the resident set sampled: "
                   "the most memory held in each timeline span (rank 0)")
    p.add_argument("--json", metavar="PATH", help="also write every repetition's figures here")
    p.add_argument("--reprice", metavar="RUN.json", help="measure nothing: price an earlier --json run's "
                   "measurements again with the current cost model and its own calibrations")
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if args.reprice:
        return reprice(args.reprice)
    from ds_hetero.planner import machine_profile
    from ds_hetero.planner.calibrate import _to_json

    cfg = hf_config()
    gb = 1e9
    print(f"model {os.path.relpath(MODEL, ROOT)}; seq {args.seq_len}, {image_tokens(cfg)} image tokens per sample, "
          f"batch {args.batch}, {WORLD} ranks one per core; load average {os.getloadavg()}", flush=True)
    runs = []
    for rep in range(args.repeats):
        t0 = time.perf_counter()
        machine = machine_profile("calibrate", refresh=True)
        print(f"\nrepetition {rep + 1}: calibrated in {time.perf_counter() - t0:.0f} s ({machine.source}; GEMM "
              f"{machine.peak_flops / 1e9:.1f} GFLOP/s per core)", flush=True)
        order = args.layouts if rep % 2 == 0 else args.layouts[::-1]
        priced = {n: predict(n, args.batch, args.seq_len, machine, cfg) for n in order}
        for name in order:
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            m = summarize(launch(run_layout, name, args.batch, args.seq_len, args.steps, args.profile,
                                 args.trace_memory, world=WORLD))
            pr = priced[name]
            pred_mem = max(pr.prediction.peak_memory.values())
            row = dict(rep=rep + 1, layout=name, seq_len=args.seq_len, batch=args.batch, load=load,
                       wall_s=time.perf_counter() - t0, measured=m,
                       predicted={"step_s": pr.step_s, "memory": pred_mem, "breakdown": pr.as_dict()["breakdown_s"]},
                       machine=_to_json(machine))  # to price these measurements again (--reprice)
            runs.append(row)
            print(f"  {name}: step {m['step_s']:.2f} s measured / {pr.step_s:.2f} s predicted "
                  f"({m['step_s'] / pr.step_s:.2f}x); memory per rank {[round(x / gb, 3) for x in m['held']]} GB "
                  f"measured (peak - base; base {[round(x / gb, 2) for x in m['base']]} GB) / {pred_mem / gb:.3f} GB "
                  f"predicted ({max(m['held']) / pred_mem:.2f}x); steps {[round(w, 2) for w in m['walls']]}; "
                  f"CPU s per rank {[round(c, 2) for c in m['cpu_s']]}; pages first touched per step "
                  f"{[round(b / gb, 2) for b in m['fresh']]} GB; load {load:.1f}; loss {m['loss']:.4f}", flush=True)
            print(f"    phases (rank 0, last step): {_phases(m['phases'][0])}\n    predicted: "
                  f"{row['predicted']['breakdown']}", flush=True)
            for span, secs, held in m["spans"] or []:
                print(f"    memory in {span:<28} {'' if secs is None else f'{secs:7.2f} s'} "
                      f"{'-' if held is None else f'{held / gb:.3f} GB'}")
            for key, shapes, count, secs in m["profile"] or []:
                print(f"    {secs:8.3f} s {count:5d}x {key:<40} {shapes}")
    report(runs, args.layouts, args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


def reprice(path: str) -> int:
    """The measurements of an earlier --json run priced again by the current cost model, each with the
    calibration taken before it."""
    from ds_hetero.planner.calibrate import _from_json

    with open(path) as f:
        runs = json.load(f)
    cfg = hf_config()
    for row in runs:
        seq, batch = row.get("seq_len", 256), row.get("batch", 2)
        pr = predict(row["layout"], batch, seq, _from_json(row["machine"]), cfg)
        row["predicted"] = {"step_s": pr.step_s, "memory": max(pr.prediction.peak_memory.values()),
                            "breakdown": pr.as_dict()["breakdown_s"]}
        print(f"rep {row['rep']} {row['layout']}: predicted {pr.step_s:.2f} s, "
              f"{row['predicted']['memory'] / 1e9:.3f} GB; {row['predicted']['breakdown']}")
    layouts = list(dict.fromkeys(r["layout"] for r in runs))
    report(runs, layouts, max(r["rep"] for r in runs))
    return 0


def report(runs, layouts, repeats) -> None:
    """Predicted against measured per repetition (wall seconds of the slowest rank, the CPU seconds
    each rank got and their share of the wall time, memory), and the layouts' order per repetition."""
    gb = 1e9
    print(f"\n{'rep':>3} {'layout':<12} {'load':>5} {'pred s':>7} {'wall s':>7} {'wall/pred':>9} {'CPU s/rank':>11} "
          f"{'CPU/pred':>8} {'core share':>10} {'pred GB':>8} {'meas GB':>8} {'meas/pred':>9}")
    for r in sorted(runs, key=lambda r: (r["rep"], layouts.index(r["layout"]))):
        m, p = r["measured"], r["predicted"]
        cpu = max(m["cpu_s"])
        held = max(m["held"])
        print(f"{r['rep']:>3} {r['layout']:<12} {r['load']:>5.1f} {p['step_s']:>7.2f} {m['step_s']:>7.2f} "
              f"{m['step_s'] / p['step_s']:>9.2f} {cpu:>11.2f} {cpu / p['step_s']:>8.2f} {cpu / m['step_s']:>10.2f} "
              f"{p['memory'] / gb:>8.3f} {held / gb:>8.3f} {held / p['memory']:>9.3f}")
    if len(layouts) == 2:
        a, b = layouts
        for rep in range(repeats):
            ra, rb = (next(r for r in runs if r["rep"] == rep + 1 and r["layout"] == n) for n in (a, b))
            pred = rb["predicted"]["step_s"] / ra["predicted"]["step_s"]
            wall = rb["measured"]["step_s"] / ra["measured"]["step_s"]
            cpu = max(rb["measured"]["cpu_s"]) / max(ra["measured"]["cpu_s"])
            same = lambda x: "same order" if (x < 1) == (pred < 1) else "ORDER DIFFERS"  # noqa: E731
            print(f"repetition {rep + 1}: {b!r} / {a!r} predicted {pred:.3f}; measured wall {wall:.3f} ({same(wall)}), "
                  f"CPU seconds {cpu:.3f} ({same(cpu)})")


if __name__ == "__main__":
    sys.exit(main())
