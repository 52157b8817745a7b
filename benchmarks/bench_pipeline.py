"""A pipelined language stage with the encoder inside vs outside the first pipeline stage, on 2 ranks.

    .venv/bin/python benchmarks/bench_pipeline.py                 # micro-batches 2, 4, 8; ~10 min on 2 free cores
    .venv/bin/python benchmarks/bench_pipeline.py --mb 4 --rounds 3 --quick
    .venv/bin/python benchmarks/bench_pipeline.py --world 4       # the same rows at 4 ranks, for the record

Where waiting is real: 2 ranks, each bound to its own core (`os.sched_setaffinity`) with one
torch thread, so a rank that waits for a pipeline neighbour leaves its core idle instead of
giving it to another rank (with 4 ranks on 2 cores a bubble costs nothing). The model is a
LLaVA (CLIP tower, Llama LM) whose encoder is a third or more of the step's compute (the table
prints the measured share). Rows, all through `ds_hetero.initialize` on the same batches:

    first_stage even    language pp2 [L/2, L/2]; the encoder on rank 0 only, inside pipeline
                        stage 0 at the language's tp (1): Megatron's single layout
    first_stage tuned   the same with fewer layers on stage 0 (--tuned, default [1, L-1])
    hetero pp2          colocated: vision dp2 on both ranks, language pp2 [L/2, L/2]; each
                        rank's encoder work in its pipeline stage's fill and drain where it can
                        (schedule/fill_drain.py)
    hetero pp2 phased   the same with the encoders' work in phases around the 1F1B (every
                        forward before it, every backward after it): what the fill-and-drain
                        order gains
    disagg 1+1          vision on rank 0, language (pp1) on rank 1, 1F1B between them
    colocated dp2       vision dp2 + language dp2, no pipeline (what plain DeepSpeed dp2 runs:
                        the whole model replicated; ds_hetero's plugin overhead against plain
                        DeepSpeed is measured by bench_layouts)

At 4 ranks (`--world 4`, global batch 32) the rows are language pp2 dp2 throughout: first_stage
with vision dp2 on pipeline stage 0's 2 ranks (tp 1, the language's), hetero pp2 with vision dp4,
disagg 2+2 (vision dp2 on ranks 0-1, language dp2 on ranks 2-3), colocated dp4. Two ranks then
share each core, so a rank's bubble hands its core to the other: for the record, not a measure
of the pipeline's waiting.

For each micro-batch count, ONE set of processes builds every row's engine and steps them
round-robin (A B C D E, then E D C B A, ...) after one warm-up round, so a shared machine's drift
hits every row alike. Per row: the median step time (per step the slowest rank), the ratio to
`hetero pp2`, the bubble fraction of each rank (StepResult: the share of the step outside
forward, backward and optimizer work), each rank's time blocked on a pipeline neighbour and
its encoder time inside the pipeline's window (timeline.pipeline_overlap), and the memory rank 0
holds for its model state (parameters, gradients, Adam moments: 16 bytes per held fp32
parameter; activations are not measured on a CPU). The load average before and after is
printed: the machine is shared, read the ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta

SIZES = dict(text_hidden=384, text_layers=4, text_heads=4, text_kv_heads=2, vision_hidden=384, vision_layers=4,
             vision_heads=4, image_size=32, patch_size=4)
QUICK = dict(text_hidden=128, text_layers=4, text_heads=4, text_kv_heads=2, vision_hidden=128, vision_layers=4,
             vision_heads=4, image_size=32, patch_size=4)


def rows(a) -> dict[str, dict]:
    layers = a["sizes"]["text_layers"]
    tuned = a["tuned"] or [1, layers - 1]
    if a["world"] == 4:
        return rows_4(tuned)
    return {
        "first_stage even": dict(placement="first_stage", stages={"vision": {"dp": 1}, "language": {"dp": 1, "pp": 2}}),
        "first_stage tuned": dict(placement="first_stage", stages={
            "vision": {"dp": 1}, "language": {"dp": 1, "pp": 2, "pp_layers": tuned}}),
        "hetero pp2": dict(placement="colocated", stages={"vision": {"dp": 2}, "language": {"dp": 1, "pp": 2}}),
        "hetero pp2 phased": dict(placement="colocated", fill_drain=False,
                                  stages={"vision": {"dp": 2}, "language": {"dp": 1, "pp": 2}}),
        "disagg 1+1": dict(placement="disaggregated", stages={"vision": {"dp": 1}, "language": {"dp": 1}}),
        "colocated dp2": dict(placement="colocated", stages={"vision": {"dp": 2}, "language": {"dp": 2}}),
    }


def rows_4(tuned) -> dict[str, dict]:
    """The same rows on 4 ranks: language pp2 dp2 (tp 1, so first_stage's encoder at the language's tp
    is vision dp2 on pipeline stage 0's 2 ranks)."""
    language = {"dp": 2, "pp": 2}
    return {
        "first_stage even": dict(placement="first_stage", stages={"vision": {"dp": 2}, "language": language}),
        "first_stage tuned": dict(placement="first_stage", stages={
            "vision": {"dp": 2}, "language": {**language, "pp_layers": tuned}}),
        "hetero pp2": dict(placement="colocated", stages={"vision": {"dp": 4}, "language": language}),
        "hetero pp2 phased": dict(placement="colocated", fill_drain=False,
                                  stages={"vision": {"dp": 4}, "language": language}),
        "disagg 2+2": dict(placement="disaggregated", stages={"vision": {"dp": 2}, "language": {"dp": 2}}),
        "colocated dp4": dict(placement="colocated", stages={"vision": {"dp": 4}, "language": {"dp": 4}}),
    }


def config(a, row, mb):
    return {
        "train_batch_size": a["batch"],
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "hetero_parallel": {"placement": row["placement"], "micro_batches": mb, "stages": row["stages"]},
    }


# ----------------------------------------------------------------------------- what each rank runs
def run(rank, world, a, mb):
    import torch
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.toy import ShapesCaptionDataset
    from ds_hetero.toy import tiny_llava
    from ds_hetero.timeline import pipeline_overlap

    names = list(rows(a))
    engines, models = {}, {}
    for name in names:
        model = tiny_llava("clip", seed=a["seed"], vocab=256, **a["sizes"])
        engines[name] = ds_hetero.initialize(model, config(a, rows(a)[name], mb), seed=a["seed"])
        engines[name].schedule.fill_drain = rows(a)[name].get("fill_drain", True)
        models[name] = model
    data = ShapesCaptionDataset.for_llava(models[names[0]].config, size=a["batch"] * (a["rounds"] + 1),
                                          seed=a["seed"] + 1, max_shapes=2, grid=3)
    batches = [[data[i * a["batch"] + j] for j in range(a["batch"])] for i in range(a["rounds"] + 1)]
    records = {n: [] for n in names}
    for r, samples in enumerate(batches):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            dist.barrier()
            t0 = time.perf_counter()
            res = engines[name].train_batch(samples)
            wall = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # the step ends when its slowest rank does
            if r == 0:
                continue  # warm-up round
            spans = [None] * world
            step = engines[name].global_steps - 1
            dist.all_gather_object(spans, engines[name].timeline.step_spans(step))
            overlap = pipeline_overlap(spans, step)[rank]
            records[name].append(dict(wall=float(wall), loss=res.loss, bubble=res.bubble_fraction, **overlap))
    out = {}
    for name in names:
        engine = engines[name]
        held = sum(p.numel() for e in engine.engines.values() for p in e.module.parameters() if not p.is_meta)
        out[name] = dict(records=records[name], held_params=held)
    for engine in engines.values():
        engine.groups.destroy()
    return out


# ----------------------------------------------------------------------------- launcher
def _child(fn, rank, world, store, args, results):
    try:
        import warnings

        import torch
        import torch.distributed as dist

        warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
        cores = sorted(os.sched_getaffinity(0))
        # one rank per core at 2 ranks: waiting is real (at 4 ranks on 2 cores two ranks share one)
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
        torch.set_num_threads(1)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 300),
                          DS_ACCELERATOR="cpu")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=900))
        value = fn(rank, world, *args)
        dist.destroy_process_group()
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001 - the parent prints it
        results.put((rank, "error", traceback.format_exc()))


def launch(fn, a, *args, timeout=3000.0):
    world = a["world"]
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "deepspeed", "transformers"])
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as tmp:
        procs = [ctx.Process(target=_child, args=(fn, r, world, os.path.join(tmp, "store"), (a, *args), results),
                             daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        out, deadline = {}, time.monotonic() + timeout
        try:
            while len(out) < world:
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
                p.join(timeout=5 if len(out) == world else 0)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [out[r] for r in range(world)]


# ----------------------------------------------------------------------------- table
def summarize(per_rank, names):
    table = {}
    for name in names:
        recs = [pr[name]["records"] for pr in per_rank]
        walls = [r["wall"] for r in recs[0]]
        base = [r["wall"] for r in per_rank[0]["hetero pp2"]["records"]]
        table[name] = dict(
            step_s=statistics.median(walls),
            # per round, against hetero pp2 in the same round: a shared machine's drift cancels
            ratio=statistics.median(w / b for w, b in zip(walls, base)),
            fastest_ratio=min(walls) / min(base),
            first_loss=recs[0][0]["loss"],
            bubble=[round(statistics.median(r["bubble"] for r in rr), 3) for rr in recs],
            wait_s=[round(statistics.median(r["pipeline_wait_s"] for r in rr), 3) for rr in recs],
            encoder_s=[round(statistics.median(r["encoder_s"] for r in rr), 3) for rr in recs],
            language_s=[round(statistics.median(r["language_s"] for r in rr), 3) for rr in recs],
            encoder_in_pipeline_s=[round(statistics.median(r["encoder_in_pipeline_s"] for r in rr), 3) for rr in recs],
            rank0_state_mb=round(per_rank[0][name]["held_params"] * 16 / 2**20, 1),
        )
    return table


def print_table(mb, table, log=print):
    log(f"\nmicro-batches {mb} (step s: median; /hetero: median of the per-round ratios; fastest: ratio of "
        "the fastest steps)")
    n = len(next(iter(table.values()))["bubble"])
    ranks = ",".join(f"r{r}" for r in range(n))  # per-rank columns: r0,r1(,r2,r3)
    w = max(5 * n + 2, len("enc in pipe s " + ranks))
    log(f"{'row':20s} {'step s':>7s} {'/hetero':>7s} {'fastest':>7s} {'bubble ' + ranks:>{w}s} "
        f"{'wait s ' + ranks:>{w}s} {'enc s ' + ranks:>{w}s} {'enc in pipe s ' + ranks:>{w}s} {'r0 state MB':>11s} "
        f"{'loss':>8s}")
    for name, t in table.items():
        pair = lambda xs: ",".join(f"{x:.2f}" for x in xs)  # noqa: E731
        log(f"{name:20s} {t['step_s']:7.3f} {t['ratio']:7.3f} {t['fastest_ratio']:7.3f} {pair(t['bubble']):>{w}s} "
            f"{pair(t['wait_s']):>{w}s} {pair(t['encoder_s']):>{w}s} "
            f"{pair(t['encoder_in_pipeline_s']) if not name.startswith('colocated dp') else '-':>{w}s} "
            f"{t['rank0_state_mb']:11.1f} {t['first_loss']:8.4f}")
    share = table["hetero pp2"]
    enc, lang = sum(share["encoder_s"]), sum(share["language_s"])
    log(f"encoder share of the step's compute (hetero pp2, all ranks): {enc / (enc + lang):.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, nargs="+", default=[2, 4, 8], help="micro-batch counts")
    p.add_argument("--rounds", type=int, default=4, help="timed rounds per micro-batch count (after one warm-up)")
    p.add_argument("--batch", type=int, default=None, help="global batch (default 8 x world)")
    p.add_argument("--world", type=int, choices=(2, 4), default=2,
                   help="ranks: 2 (one per core: the measurement) or 4 (the same rows at 4 ranks, two per core)")
    p.add_argument("--tuned", type=int, nargs=2, default=None, help="pp_layers of the tuned first_stage row")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not a measurement)")
    p.add_argument("--hidden", type=int, default=None, help="text and vision hidden size (default 384)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write every table here")
    args = p.parse_args(argv)
    sizes = dict(QUICK if args.quick else SIZES)
    if args.hidden:
        sizes.update(text_hidden=args.hidden, vision_hidden=args.hidden)
    a = dict(sizes=sizes, rounds=args.rounds, batch=args.batch or 8 * args.world, tuned=args.tuned,
             seed=args.seed, world=args.world)
    print(f"load average before: {os.getloadavg()}, cores {os.cpu_count()}, sizes {a['sizes']}", flush=True)
    out = {}
    for mb in args.mb:
        names = list(rows(a))
        table = summarize(launch(run, a, mb), names)
        print_table(mb, table)
        sys.stdout.flush()
        out[mb] = table
    print(f"\nload average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
