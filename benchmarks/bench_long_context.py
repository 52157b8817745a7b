"""Long multimodal sequences: the language stage on sequence shards, the encoder in three layouts.

    .venv/bin/python benchmarks/bench_long_context.py            # ~2k-token samples (8 images x 256 tokens + text)
    .venv/bin/python benchmarks/bench_long_context.py --quick    # ~300-token samples, a few minutes on 2 loaded cores

4 ranks, one LLaVA (CLIP tower, Llama LM, both built from config with seeded weights), the
language stage always tp2 cp2 with sequence parallelism (each rank holds 1/4 of every sequence
between blocks, 1/2 inside attention after the Ulysses all-to-all). Samples are mostly image
tokens (8 images per sample). Rows differ only in how the encoder runs:

    hetero            vision tp1 dp4: each rank encodes 1/4 of the images, the boundary moves
                      every rank only the image rows of its own sequence shard
    (b) encoder tp    vision tp2 dp2: the encoder split over the language's tp (and the cp ranks
                      sharing the images as dp), as a single-layout system would run it
    (a) encoder in    every cp rank of a language replica encodes ALL the replica's images (over
        language      the language's tp), then keeps its shard. Emulated: vision tp2 dp2 with every
        layout        encoder forward run twice (its second output enters the graph times zero,
                      so backward work doubles too): the same encoder work per rank as encoding
                      the cp peer's images as well. Its real boundary moves nothing (every rank
                      already holds every row), so its bytes are reported as 0; the emulation's
                      exchange is (b)'s and is included in its time (a small overestimate).

Reported per row: median step time (slowest rank, after one warm-up step), the encoder's share of
the step (vision forward + backward over the step, mean over ranks), peak memory per rank (max
RSS on CPU; device peak on an accelerator), boundary bytes per step (forward rows) and their lower
bound. Each row runs in its own 4 processes. Read the ratios, not the absolute times: on a shared
2-core machine 4 ranks are oversubscribed and other jobs add noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "recipes"))  # the main job's peak-memory figure
from cpu_ranks import launch  # noqa: E402  (one launcher for the benches)
from train_llava import peak_memory_mb  # noqa: E402  (device peak on an accelerator, max RSS on CPU)

ROWS = {
    "hetero": {"vision": {"tp": 1, "dp": 4}},
    "(b) encoder tp": {"vision": {"tp": 2, "dp": 2}},
    "(a) encoder in language layout": {"vision": {"tp": 2, "dp": 2}, "encode_twice": True},
}
LANGUAGE = {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}


def sizes(quick: bool) -> dict:
    if quick:  # 16 images x 16 tokens + 48 text = 304 tokens per sample
        return dict(image_size=32, patch_size=8, images=16, text=48, batch=4, steps=3, vision_hidden=64,
                    vision_layers=4, text_hidden=64, text_layers=2)
    # 8 images x 256 tokens + 64 text = 2112 tokens per sample
    return dict(image_size=64, patch_size=4, images=8, text=64, batch=4, steps=3, vision_hidden=128,
                vision_layers=6, text_hidden=128, text_layers=4)


def build_model(a):
    from ds_hetero.toy import tiny_llava

    return tiny_llava("clip", seed=0, text_hidden=a["text_hidden"], text_layers=a["text_layers"], text_heads=4,
                      text_kv_heads=2, vision_hidden=a["vision_hidden"], vision_layers=a["vision_layers"],
                      vision_heads=4, image_size=a["image_size"], patch_size=a["patch_size"])


def make_batches(model, a, n):
    """n global batches: each sample `images` images (their placeholders first), then text."""
    import torch

    from ds_hetero.toy import llava_tokens_per_image

    cfg, t = model.config, llava_tokens_per_image(model)
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(n):
        samples = []
        for _ in range(a["batch"]):
            text = torch.randint(0, cfg.image_token_id - 1, (a["text"],), generator=gen)
            ids = torch.cat([torch.full((t * a["images"],), cfg.image_token_id), text])
            labels = torch.cat([torch.full((t * a["images"],), -100), text])
            pixels = torch.randn(a["images"], 3, a["image_size"], a["image_size"], generator=gen)
            samples.append({"input_ids": ids, "labels": labels, "pixel_values": pixels})
        batches.append(samples)
    return batches


def encode_twice():
    """Row (a): every encoder forward runs twice (module docstring); the bench's own patch."""
    from ds_hetero.families.llava.adapter import LlavaVisionStage

    once = LlavaVisionStage.forward

    def twice(self, pixel_values):
        rows = once(self, pixel_values)
        return rows + 0 * once(self, pixel_values).sum()

    LlavaVisionStage.forward = twice


def timed_step(engine, samples) -> dict:
    """One step from a common start (barrier): wall time and what StepResult says."""
    import time

    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    r = engine.train_batch(samples)
    return {"wall": time.perf_counter() - t0, "loss": r.loss, "step_time": r.step_time, "stage_time": r.stage_time,
            "boundary_bytes_total": r.boundary_bytes_total, "boundary_bytes_lower_bound": r.boundary_bytes_lower_bound}


def run_row(rank, world, name, a):
    import ds_hetero

    row = ROWS[name]
    if row.get("encode_twice"):
        encode_twice()
    model = build_model(a)
    config = {
        "train_batch_size": a["batch"], "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_allow_untested_optimizer": True, "gradient_clipping": 1.0, "steps_per_print": 10**9,
        "hetero_parallel": {"micro_batches": 1, "stages": {"vision": row["vision"], "language": LANGUAGE}},
    }
    engine = ds_hetero.initialize(model, config)
    batches = make_batches(model, a, a["steps"] + 1)
    recs = [timed_step(engine, samples) for samples in batches]
    peak = peak_memory_mb(engine.device)
    engine.groups.destroy()
    return {"recs": recs[1:], "peak_mb": peak, "seq_len": int(batches[0][0]["input_ids"].numel())}


def summarize(name, per_rank):
    steps = len(per_rank[0]["recs"])
    wall = statistics.median(max(r["recs"][i]["wall"] for r in per_rank) for i in range(steps))
    share = statistics.mean(
        sum(v for k, v in rec["stage_time"].get("vision", {}).items() if k in ("forward", "backward")) / rec["step_time"]
        for r in per_rank for rec in r["recs"])
    rec0 = per_rank[0]["recs"][-1]
    encoded_twice = ROWS[name].get("encode_twice", False)
    return {
        "row": name, "step_s": wall, "encoder_share": share, "peak_mb": [round(r["peak_mb"]) for r in per_rank],
        "boundary_bytes": 0 if encoded_twice else rec0["boundary_bytes_total"],
        "lower_bound": 0 if encoded_twice else rec0["boundary_bytes_lower_bound"],
        "loss": rec0["loss"], "seq_len": per_rank[0]["seq_len"],
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rows", nargs="*", default=list(ROWS))
    p.add_argument("--json", default=None, help="write the table here as JSON")
    args = p.parse_args(argv)
    a = sizes(args.quick)
    table = [summarize(name, launch(run_row, name, a)) for name in args.rows]
    base = next((r["step_s"] for r in table if r["row"] == "hetero"), None)
    print(f"LLaVA, {table[0]['seq_len']} tokens per sample ({a['images']} images), language tp2 cp2 sp, 4 ranks")
    print(f"{'row':32} {'step s':>8} {'vs hetero':>9} {'encoder':>8} {'boundary B':>11} {'lower bd':>9}  peak MB per rank")
    for r in table:
        ratio = f"{r['step_s'] / base:.2f}x" if base else "-"
        print(f"{r['row']:32} {r['step_s']:8.2f} {ratio:>9} {r['encoder_share']:8.0%} {r['boundary_bytes']:11d} "
              f"{r['lower_bound']:9d}  {r['peak_mb']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
