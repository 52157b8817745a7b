"""The real-data path (issue 45): each rank encodes only its stages' samples, read ahead by workers; one run.

    .venv/bin/python benchmarks/bench_data.py           # the three parts below (~4 min on a loaded 2-core machine)
    .venv/bin/python benchmarks/bench_data.py --quick   # fewer steps and rounds

1. Samples a rank encodes per step over the samples its stages use (goal 1.00 at every size). "Used":
   from the step's plan, its language dp share (plan.language_positions) and every sample whose images
   its encoder dp rank encodes (plan.encoder_positions). "Encoded": at 2 and 4 ranks launched, the real
   `__getitem__` calls the rank made in the step (the dataset wrapped, 0 workers so the calls are in the
   rank's process), checked to be exactly the used samples' rows; at 2 .. 256 ranks computed, what the
   engine reads (RankDataPath.read_positions, what data/planned_reader.py reads) from the plan of
   a light batch (no launch). The old design encoded the whole global batch on every rank: global / used
   beside it. The config is ds_configs/llava_colocated.json scaled (vision tp1 dp=N, language tp2 dp=N/2,
   balance "tokens"), 16 samples per rank; the batch: the shipped rows' length-index ids
   (recipes/data/shapes_messages.jsonl, tiny Qwen2-VL), drawn with replacement.
2. Real image sizes: 896x672 JPEGs (smooth noise, written to a temp dir), Qwen2-VL's image processor at
   its defaults (patch 14, merge 2, min_pixels 56*56, max_pixels 28*28*1280: 768 image tokens, 3072 x 1176
   pixel values a sample). StepPrefetcher (data/prefetch.py, what the engine reads with) reads a rank's
   8 samples of a global batch of 16 per step with 0, 1 and 2 workers (prefetch_steps 2), and a sleep
   stands in for the accelerator's step (the host process waits on it, its CPU free, as on a GPU).
   The step lengths are 0.75, 1.5 and 3 times one worker's encode time for a step's share, measured in
   the same run (the encode rate moves with the machine's load), so the workers' rate over the step
   rate is 0.75 .. 6. Goal: data wait <= 5% of the step wherever the workers' rate exceeds the step
   rate. What is left once the workers are ahead is the main process receiving the step's tensors from
   them (shared memory, torch's DataLoader): about a millisecond per 14 MB sample here.
3. The main job's recipe (recipes/train_llava.py: its model, its --data dataset and its engine) with
   --data recipes/data/shapes_messages.jsonl, --model-family qwen2-vl, 2 ranks one per core, its
   config scaled to 2 ranks, against the same steps fed pre-encoded samples (the same dataset
   wrapped, every row encoded once before the run): both engines in one set of processes, stepping in
   turn (A B, B A, ...), losses checked equal. Goal: <= 1.05x. 0 data workers (the recipe's default;
   the launcher's ranks are daemonic processes, which cannot start DataLoader workers, and bound one
   per core a worker would share the rank's core): the reads are in the step, its full cost shown.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_ranks import launch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "recipes", "data", "shapes_messages.jsonl")
CONFIG = os.path.join(ROOT, "ds_configs", "llava_colocated.json")
PER_RANK = 16
COMPUTED_WORLDS = (2, 4, 8, 16, 32, 64, 128, 256)


# ---------------------------------------------------------------------------------------- shared
def scaled_config(world: int, batch: int | None = None) -> dict:
    """The default colocated config on `world` ranks: every stage keeps its tp and cp, dp fills the rest."""
    with open(CONFIG) as f:
        ds = json.load(f)
    ds["train_batch_size"] = batch if batch is not None else PER_RANK * world
    for spec in ds["hetero_parallel"]["stages"].values():
        spec["dp"] = world // (spec.get("tp", 1) * spec.get("cp", 1))
    return ds


class Reads:
    """A dataset, its full reads (`__getitem__`) counted; `pre_encode()` then serves them from memory.
    `light` and `prepare` pass through, so the engine plans and indexes as with the dataset itself."""

    def __init__(self, inner):
        self.inner, self.calls, self.cache = inner, [], None

    def prepare(self, group=None):
        self.inner.prepare(group)
        return self

    def __len__(self):
        return len(self.inner)

    def light(self, index):
        return self.inner.light(index)

    def pre_encode(self):
        self.cache = [self.inner[i] for i in range(len(self.inner))]

    def __getitem__(self, index):
        self.calls.append(index)
        return dict(self.cache[index]) if self.cache is not None else self.inner[index]


def used_positions(config, plan, held) -> set[int]:
    """The batch positions whose full sample this rank's stages use in the plan: its language share and the
    samples whose items its encoder dp ranks encode. `held`: (stage, dp) pairs."""
    language = config.language.name
    out: set[int] = set()
    for stage, dp in held:
        out |= plan.language_positions(dp) if stage == language else plan.encoder_positions(stage, dp)
    return out


def tiny_qwen2_vl():
    from ds_hetero.families.meta import builtin_model

    return builtin_model("tiny-qwen2-vl", seed=0)


# ---------------------------------------------------------------------------------------- part 1
def plan_table(worlds=COMPUTED_WORLDS, seed: int = 0) -> dict[int, dict]:
    """Per world size (pure, no process group): the used samples per rank, the new read over used (max over
    ranks) and the old design's global / used (mean over ranks)."""
    import random

    from ds_hetero import load_config
    from ds_hetero.families import adapter_for
    from ds_hetero.sft_data import SFTDataset
    from ds_hetero.step.rank_data import HeldShare, RankDataPath
    from ds_hetero.toy.processors import tiny_processor

    model = tiny_qwen2_vl()
    adapter = adapter_for(model)
    data = SFTDataset.from_file(SHIPPED, tiny_processor(model), index_dir=None).prepare()
    rows = [data.light(i) for i in range(len(data))]
    out = {}
    for world in worlds:
        cfg = load_config(scaled_config(world), world)
        rng = random.Random(seed + world)
        batch = [rows[rng.randrange(len(rows))] for _ in range(cfg.global_batch_size)]
        plan = RankDataPath(cfg, adapter, (), None).plan_of(batch)
        new, old, used_n = [], [], []
        for rank in range(world):
            held = [(s, cfg.stages[s].coord(rank).dp) for s in cfg.stages_of_rank(rank)]
            path = RankDataPath(cfg, adapter, [HeldShare(s, dp, cfg.micro_batches_of(s)) for s, dp in held], None)
            read = path.read_positions(plan)  # what the engine's planned reader reads
            used = used_positions(cfg, plan, held)
            assert used <= read, (world, rank, sorted(used - read))  # never less than the stages use
            new.append(len(read) / len(used))
            old.append(cfg.global_batch_size / len(used))
            used_n.append(len(used))
        out[world] = dict(batch=cfg.global_batch_size, used=statistics.mean(used_n), new=max(new),
                          old=statistics.mean(old))
    return out


def count_reads(rank, world, a):
    """Launched: per step, this rank's `__getitem__` calls over the samples its stages use (0 workers)."""
    import ds_hetero
    from ds_hetero.sft_data import SFTDataset
    from ds_hetero.toy.processors import tiny_processor

    model = tiny_qwen2_vl()
    data = Reads(SFTDataset.from_file(a.repeated, tiny_processor(model), image_folder=os.path.dirname(SHIPPED),
                                      index_dir=None))
    ds = scaled_config(world)
    ds["hetero_parallel"]["data_workers"] = 0
    engine = ds_hetero.initialize(model, ds, training_data=data, seed=0)
    held = [(s.name, s.coord.dp) for s in engine.stages.held]
    out = []
    for step in range(a.count_steps):
        plan = engine.data_path.plan_of(engine.loader.light_batch(step))
        used = used_positions(engine.config, plan, held)
        before = len(data.calls)
        engine.train_batch()
        calls = data.calls[before:]
        indices = engine.loader.indices(step)
        assert sorted(calls) == sorted(indices[p] for p in used), (rank, step)  # exactly the used rows, once each
        out.append((len(calls), len(used), len(indices)))
    engine.groups.destroy()
    return out


def repeated_file(folder: str, copies: int) -> str:
    """The shipped rows `copies` times (a global batch of 16 per rank at 4 ranks needs 64 of the 48)."""
    with open(SHIPPED) as f:
        lines = [line for line in f if line.strip()]
    path = os.path.join(folder, "shapes_repeated.jsonl")
    with open(path, "w") as f:
        f.writelines(lines * copies)
    return path


def part1(a, folder):
    table = plan_table()
    measured = {}
    for world in (2, 4):
        per_rank = launch(count_reads, a, world=world, timeout=900.0)
        steps = [s for r in per_rank for s in r]
        measured[world] = dict(new=max(c / u for c, u, _ in steps), calls=statistics.mean(c for c, _, _ in steps),
                               old=statistics.mean(g / u for _, u, g in steps))
    print(f"\n1. Samples encoded per rank per step / samples its stages use; {os.path.basename(CONFIG)} scaled "
          f"(vision dp N, language tp2 dp N/2), {PER_RANK} per rank, tiny Qwen2-VL, shipped rows' ids")
    print(f"{'ranks':>5}  {'global':>6}  {'used/rank':>9}  {'launched':>8}  {'computed':>8}  {'old design':>10}")
    for world, r in table.items():
        m = measured.get(world)
        launched = f"{m['new']:.2f}" if m else "-"
        print(f"{world:5d}  {r['batch']:6d}  {r['used']:9.1f}  {launched:>8}  {r['new']:8.2f}  {r['old']:10.2f}")
    return table, measured


# ---------------------------------------------------------------------------------------- part 2
QWEN2_VL = dict(patch_size=14, spatial_merge_size=2, temporal_patch_size=2)  # Qwen2VLImageProcessor's defaults
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280


def real_size_dataset(folder: str, images: int, rows: int):
    """`rows` one-image conversations over `images` 896x672 JPEGs (a coarse random field upsampled, plus
    pixel noise: photo-like JPEG sizes, not a flat colour), encoded with Qwen2-VL's image geometry."""
    import types

    import numpy as np
    from PIL import Image

    from ds_hetero.sft_data import SFTDataset
    from ds_hetero.toy.processors import tiny_qwen2_vl_processor

    rng = np.random.default_rng(0)
    for i in range(images):
        coarse = Image.fromarray(rng.integers(0, 256, (21, 28, 3), dtype=np.uint8)).resize((896, 672), Image.BICUBIC)
        noisy = np.asarray(coarse, dtype=np.int16) + rng.integers(-24, 25, (672, 896, 3))
        Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(os.path.join(folder, f"{i:03d}.jpg"), quality=90)
    path = os.path.join(folder, "real.jsonl")
    with open(path, "w") as f:
        for r in range(rows):
            f.write(json.dumps({"messages": [{"role": "user", "content": "<image>\nwhat is here ?"},
                                             {"role": "assistant", "content": "a green cross at the top left"}],
                                "images": [f"{r % images:03d}.jpg"]}) + "\n")
    config = copy.deepcopy(tiny_qwen2_vl().config)  # the tiny model's token ids, the real model's image geometry
    for key, value in QWEN2_VL.items():
        setattr(config.vision_config, key, value)
    processor = tiny_qwen2_vl_processor(types.SimpleNamespace(config=config), MIN_PIXELS, MAX_PIXELS)
    return SFTDataset.from_file(path, processor, index_dir=None).prepare()


def encode_rate(data, n: int) -> float:
    """Samples/s one process encodes (decode + processor), rows read in turn after one warm-up."""
    data[0]
    start = time.perf_counter()
    for i in range(1, n + 1):
        data[i % len(data)]
    return n / (time.perf_counter() - start)


def wait_per_step(data, workers: int, step_s: float, a, share: int, batch: int) -> float:
    """Mean data wait per step of a rank reading `share` of every `batch` with `workers` workers, each step
    `step_s` of stand-in compute; the first `a.warm2` steps left out (the workers' start and the read of the
    first step, which nothing runs before to hide: paid once per run)."""
    from ds_hetero.data.loader import GlobalBatchLoader
    from ds_hetero.data.prefetch import StepPrefetcher

    loader = GlobalBatchLoader(data, batch, seed=0)
    reader = StepPrefetcher(loader, lambda step: set(range(share)), 0, workers, prefetch_steps=2, timeout_s=300)
    waits = []
    try:
        for step in range(a.warm2 + a.steps2):
            full, problem, waited = reader.next(step)
            assert problem is None and len(full) == share, problem
            waits.append(waited)
            time.sleep(step_s)  # the accelerator's step: the host waits, its CPU free for the workers
    finally:
        reader.close()
    return statistics.mean(waits[a.warm2:])


STEP_LENGTHS = (0.75, 1.5, 3.0)  # the stand-in step, in units of one worker's encode time for a step's share


def part2(a, folder):
    share, batch = 8, 16
    data = real_size_dataset(folder, images=16, rows=64)
    sample = data[0]
    rate = encode_rate(data, a.encode_samples)
    per_step = share / rate  # seconds one worker needs for a step's share
    rows = [(k, w) for k in STEP_LENGTHS for w in (0, 1, 2)]
    waits = {row: [] for row in rows}
    for r in range(a.rounds2):  # interleaved: every round every row, the order alternating
        for k, w in (rows if r % 2 == 0 else rows[::-1]):
            waits[k, w].append(wait_per_step(data, w, k * per_step, a, share, batch))
    print(f"\n2. Data wait, 896x672 JPEGs through Qwen2-VL's image processor (min_pixels 56*56, max_pixels "
          f"28*28*1280: {int(sample['input_ids'].numel())} tokens, pixel_values {tuple(sample['pixel_values'].shape)} "
          f"a sample); StepPrefetcher reading {share} of a global batch of {batch} per step, prefetch_steps 2; a "
          f"sleep as the step")
    # the encode time of a step's share under this run's load: the 0-worker rows read it in the step
    encode_s = statistics.median(x for k in STEP_LENGTHS for x in waits[k, 0])
    print(f"   encode rate {rate:.1f} samples/s per process measured before the rows (this machine), "
          f"{share / encode_s:.1f} during them (the 0-worker rows' median wait: the load moves); the step "
          f"lengths: {', '.join(f'{k}' for k in STEP_LENGTHS)} x {per_step:.3f} s (one process's encode time "
          f"of a step's share, before); wait: mean of {a.steps2} steps after {a.warm2}, median of {a.rounds2} "
          f"rounds; % of the step's wall (sleep + wait)")
    print(f"{'step s':>6}  {'workers':>7}  {'workers/step rate':>17}  {'wait s/step':>11}  {'wait % of step':>14}  "
          f"{'goal <= 5%':>10}")
    out = {}
    for k, w in rows:
        step_s = k * per_step
        wait = statistics.median(waits[k, w])
        ratio = w * step_s / encode_s  # the workers' steps/s over the steps' steps/s (the rate during the rows)
        fraction = wait / (step_s + wait)
        goal = ("met" if fraction <= 0.05 else "MISSED") if ratio > 1 else "-"
        print(f"{step_s:6.3f}  {w:7d}  {ratio:17.2f}  {wait:11.4f}  {100 * fraction:13.1f}%  {goal:>10}")
        out[k, w] = dict(step=step_s, wait=wait, ratio=ratio, fraction=fraction)
    return dict(rate=rate, rate_in_rows=share / encode_s, rows=out)


# ---------------------------------------------------------------------------------------- part 3
ROWS3 = ("data", "pre-encoded")


def recipe_steps(rank, world, a):
    """Both engines of the recipe (its model, its --data dataset; one reading the file, one fed the same rows
    pre-encoded) step in turn; per row and step: wall seconds, data wait, loss."""
    import torch
    import torch.distributed as dist

    import ds_hetero

    sys.path.insert(0, os.path.join(ROOT, "recipes"))
    import train_llava as recipe

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})  # one rank per core: a rank's reads are on its time
    torch.set_num_threads(1)
    args = recipe.parse_args(["--data", SHIPPED, "--model-family", "qwen2-vl"])
    ds = scaled_config(world, batch=json.load(open(CONFIG))["train_batch_size"])  # the recipe's batch: 16
    engines, datasets = {}, {}
    for row in ROWS3:
        model, _ = recipe.build_model(args)
        dataset = recipe.build_dataset(args, model)
        dataset.log = None
        datasets[row] = dataset if row == "data" else Reads(dataset)
        engines[row] = ds_hetero.initialize(model, copy.deepcopy(ds), training_data=datasets[row], seed=args.seed)
    datasets["pre-encoded"].pre_encode()  # every row once, before the first step
    rec = {row: [] for row in ROWS3}
    for i in range(a.warmup3 + a.rounds3):
        for row in (ROWS3 if i % 2 == 0 else ROWS3[::-1]):
            dist.barrier()
            start = time.perf_counter()
            r = engines[row].train_batch()
            wall = time.perf_counter() - start
            if i >= a.warmup3:
                rec[row].append((wall, r.data_wait, r.loss))
    for e in engines.values():
        e.groups.destroy()
    return rec


def part3(a):
    world = 2
    per_rank = launch(recipe_steps, a, world=world, timeout=900.0)
    table = {}
    for row in ROWS3:
        steps = list(zip(*(r[row] for r in per_rank)))  # per step, every rank's (wall, wait, loss)
        table[row] = dict(step=statistics.median(max(x[0] for x in s) for s in steps),
                          wait=statistics.mean(max(x[1] for x in s) for s in steps), losses=[s[0][2] for s in steps])
    assert table["data"]["losses"] == table["pre-encoded"]["losses"], table  # the same steps
    base = table["pre-encoded"]["step"]
    print(f"\n3. recipes/train_llava.py --data {os.path.relpath(SHIPPED, ROOT)} --model-family qwen2-vl, {world} "
          f"ranks one per core, {os.path.basename(CONFIG)} scaled (vision dp2, language tp2 dp1: each rank uses all "
          f"16 samples), 0 data workers (the recipe's default); medians of {a.rounds3} rounds (A B, B A, ...)")
    print(f"{'row':12}  {'step s':>7}  {'vs pre-encoded':>14}  {'data wait s/step':>16}")
    for row, r in table.items():
        print(f"{row:12}  {r['step']:7.3f}  {r['step'] / base:13.3f}x  {r['wait']:16.4f}")
    return table


# ---------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and rounds (a smoke test)")
    p.add_argument("--parts", default="1,2,3", help="comma-separated: which parts to run")
    a = p.parse_args(argv)
    a.parts = {int(x) for x in a.parts.split(",") if x}
    a.count_steps = 2 if a.quick else 3
    a.encode_samples = 8 if a.quick else 24
    a.warm2, a.steps2, a.rounds2 = (2, 4, 1) if a.quick else (3, 10, 3)
    a.warmup3, a.rounds3 = (1, 3) if a.quick else (2, 10)
    return a


def main(argv=None):
    a = parse_args(argv)
    out = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        a.repeated = repeated_file(folder, copies=4)
        if 1 in a.parts:
            out[1] = part1(a, folder)
        if 2 in a.parts:
            out[2] = part2(a, folder)
        if 3 in a.parts:
            out[3] = part3(a)
    print(f"\n(machine shared with other jobs: load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{time.perf_counter() - start:.0f} s)")
    return out


if __name__ == "__main__":
    main()
