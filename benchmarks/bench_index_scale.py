"""The length index at scale (issue 45, "Data of any size"): build time, memory per rank, size on disk.

    .venv/bin/python benchmarks/bench_index_scale.py                      # 100k rows, 1 and 2 ranks (~3 min, 2 cores)
    .venv/bin/python benchmarks/bench_index_scale.py --rows 1000000       # 1M rows (the time grows linearly)
    .venv/bin/python benchmarks/bench_index_scale.py --rows 20000 --ranks 1

The data: a JSONL file of `--rows` messages rows (1 to 3 user/assistant exchanges of shape words, one
image in most rows), written to a temp folder with 4 small PNGs of different sizes that all rows reuse:
the index reads each image's header per row, as it would for distinct files, so the cost per row is the
real one while the data stays a few MB of images. The processor: the tiny Qwen2-VL's (ds_hetero.toy),
its family rule giving each image's token count from its size.

Per rank count (1, 2: gloo CPU ranks, benchmarks/cpu_ranks.py), one fresh build (no cache):
- seconds: `build_index` from the call to the memory-mapped index (rank 0's wall clock);
- rows/s: rows over seconds, all ranks together;
- RSS before: the rank's resident memory before the build (torch and transformers imported);
- RSS peak: the most the rank held during the build (getrusage ru_maxrss, which counts from its fork);
- RSS after: resident with the memory-mapped index open (after gc); trimmed: after glibc's malloc_trim
  (the rest was freed memory the allocator kept, reusable by the process); after read: after reading
  every row's length once (the mapped pages become resident: file pages, shared by a node's ranks);
- index MB: the cache folder on disk, and bytes per row.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import hashlib
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WORDS = ("a red green blue magenta yellow circle square triangle cross at the top bottom left right and "
         "of what is here ?").split()
IMAGE_SIZES = [(32, 32), (64, 48), (40, 96), (128, 128)]  # (w, h): 4 different token counts


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def write_data(folder: str, rows: int, seed: int = 0) -> str:
    """`rows` JSONL rows reusing 4 small PNGs; returns the file's path."""
    from PIL import Image

    rng = random.Random(seed)
    for k, (w, h) in enumerate(IMAGE_SIZES):
        Image.new("RGB", (w, h), (40 * k, 200 - 40 * k, 90)).save(os.path.join(folder, f"{k}.png"))
    path = os.path.join(folder, "rows.jsonl")
    with open(path, "w") as f:
        for i in range(rows):
            image = rng.random() < 0.9
            messages = []
            for turn in range(rng.randint(1, 3)):
                question = " ".join(rng.choices(WORDS, k=rng.randint(3, 12)))
                answer = " ".join(rng.choices(WORDS, k=rng.randint(2, 30)))
                if turn == 0 and image:
                    question = "<image>\n" + question
                messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            row = {"messages": messages, "images": [f"{rng.randrange(len(IMAGE_SIZES))}.png"] if image else []}
            f.write(json.dumps(row) + "\n")
    return path


def _processor():
    from ds_hetero.toy import tiny_qwen2_vl
    from ds_hetero.toy.processors import tiny_processor

    return tiny_processor(tiny_qwen2_vl(seed=0))


def build_once(rank: int, world: int, data: str, index_dir: str) -> dict:
    """One fresh build on this rank (collective when world > 1); the rank's figures."""
    import torch.distributed as dist

    from ds_hetero.families import image_token_rule
    from ds_hetero.sft_data.index_build import build_index, cache_folder
    from ds_hetero.sft_data.length_index import ARRAYS
    from ds_hetero.sft_data.sources import open_source

    processor = _processor()
    source = open_source(data)
    gc.collect()
    before = rss_mb()
    if dist.is_initialized():
        dist.barrier()
    start = time.perf_counter()
    index = build_index(source, processor, os.path.dirname(data), None, index_dir, rule=image_token_rule(processor))
    seconds = time.perf_counter() - start
    peak = peak_mb()
    gc.collect()
    after = rss_mb()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what is freed but kept by the allocator, given back
    trimmed = rss_mb()
    total = sum(index.length(i) for i in range(len(index)))  # every row's length read once
    touched = rss_mb()
    folder = cache_folder(source, processor, os.path.dirname(data), index_dir)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    digest = hashlib.blake2b(digest_size=8)  # the same index at every rank count (checked in main)
    for name in ARRAYS:
        digest.update(np.ascontiguousarray(getattr(index, name)).tobytes())
    return {"rank": rank, "world": world, "seconds": seconds, "before": before, "peak": peak, "after": after,
            "trimmed": trimmed,
            "touched": touched, "index_bytes": size, "rows": len(index), "skipped": len(index.skipped),
            "tokens": total, "runs": int(len(index.tokens)), "digest": digest.hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--keep", help="write the data here and keep it (default: a temp folder, removed)")
    args = parser.parse_args()
    from cpu_ranks import launch

    header = (f"{'rows':>9} {'ranks':>5} {'seconds':>8} {'rows/s':>8} {'RSS before':>10} {'RSS peak':>9} "
              f"{'peak-before':>11} {'RSS after':>9} {'trimmed':>7} {'after read':>10} {'index MB':>8} {'B/row':>6}")
    lines = []
    for rows in args.rows:
        folder = args.keep or tempfile.mkdtemp(prefix="bench_index_scale_")
        os.makedirs(folder, exist_ok=True)
        t = time.perf_counter()
        data = write_data(folder, rows)
        print(f"wrote {rows} rows ({os.path.getsize(data) / 2**20:.1f} MB JSONL) in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        digests: set[str] = set()
        try:
            for world in args.ranks:
                index_dir = os.path.join(folder, f"index-{world}")
                results = launch(build_once, data, index_dir, world=world, timeout=3600)
                for r in results:
                    print(json.dumps(r), flush=True)
                digests.update(r["digest"] for r in results)
                if len(digests) != 1:
                    raise SystemExit(f"the index differs between rank counts or ranks: {sorted(digests)}")
                r0 = results[0]
                worst = max(results, key=lambda r: r["peak"])
                lines.append(f"{rows:>9} {world:>5} {r0['seconds']:>8.1f} {rows / r0['seconds']:>8.0f} "
                             f"{worst['before']:>10.0f} {worst['peak']:>9.0f} {worst['peak'] - worst['before']:>11.0f} "
                             f"{max(r['after'] for r in results):>9.0f} {max(r['trimmed'] for r in results):>7.0f} "
                             f"{max(r['touched'] for r in results):>10.0f} "
                             f"{r0['index_bytes'] / 2**20:>8.1f} {r0['index_bytes'] / rows:>6.0f}")
                print(header + "\n" + lines[-1], flush=True)
                shutil.rmtree(index_dir, ignore_errors=True)
        finally:
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
    print("\nlength index build (tiny Qwen2-VL processor; MB = MiB; memory: the worst rank)")
    print(header)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
