"""Peak memory per rank while the engine is built: the whole model on every rank vs meta + weights.

    .venv/bin/python benchmarks/bench_loading.py             # a ~120M-parameter LLaVA (~0.5 GB fp32), ~3 min on 2 cores
    .venv/bin/python benchmarks/bench_loading.py --quick     # ~30M parameters, ~1.5 min

The model (CLIP tower + projector, Llama LM with a 16k vocabulary) is built once, saved as a
sharded safetensors checkpoint, and freed. Then four rows, each on 4 fresh gloo processes:

    colocated      vision tp1 dp4, language tp2 dp2 on ranks 0-3
    disaggregated  vision dp2 on ranks 0-1, language tp2 dp1 on ranks 2-3
  x
    built          every rank builds the whole model (seeded), then ds_hetero.initialize shards it
    meta+weights   every rank builds it on the meta device, initialize(..., weights=DIR) reads its shards

Per rank: the peak resident memory (VmHWM, reset through /proc/self/clear_refs just before the
model is built, after a warm-up of both ways on a tiny model so lazy imports are not counted)
over the RSS at that moment, i.e. what building the model and the engines cost; the model
bytes the rank holds after initialize; and, for meta+weights, the bytes read from the
checkpoint per stage (a disaggregated rank reads nothing of the other stage; a tp2 rank reads
half of every sharded tensor, the vocabulary-parallel embedding and head included, and the
replicated norms whole).

ZeRO stage 0 by default (--zero 1 for ZeRO 1): on CPU, ZeRO 1/2 flatten the held parameters
into one buffer and keep an fp32 copy of the rank's partition, i.e. up to 3x the held bytes in
host memory, the same in both ways; on GPUs those copies are device memory. Stage 0 shows the
host memory the model itself takes. A meta+weights rank peaks at what it holds plus at most
one tensor in flight (its slices are copied from the file's memory map, opened per tensor).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_ranks import DEFAULT_WORLD, launch  # noqa: E402  (the same 4-process launcher)

DEFAULTS = dict(text_hidden=1024, text_layers=6, text_heads=16, text_kv_heads=8, vocab=16000,
                vision_hidden=768, vision_layers=4, vision_heads=12, zero=0)
QUICK = dict(DEFAULTS, text_hidden=512, text_layers=4, vocab=8000, vision_hidden=384, vision_layers=4, vision_heads=6)
PLACEMENTS = {
    "colocated": {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}},
    "disaggregated": {"vision": {"dp": 2, "ranks": [0, 1]}, "language": {"tp": 2, "dp": 1, "ranks": [2, 3]}},
}
MODES = ("built", "meta+weights")
MB = 2**20


def build_model(a):
    from ds_hetero.toy import tiny_llava

    return tiny_llava("clip", seed=0, text_hidden=a["text_hidden"], text_layers=a["text_layers"],
                      text_heads=a["text_heads"], text_kv_heads=a["text_kv_heads"], vocab=a["vocab"],
                      vision_hidden=a["vision_hidden"], vision_layers=a["vision_layers"],
                      vision_heads=a["vision_heads"])


def ds_config(placement, a):
    return {
        "train_batch_size": 8, "zero_optimization": {"stage": a["zero"]}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
        "hetero_parallel": {"placement": placement, "micro_batches": 2, "stages": PLACEMENTS[placement]},
    }


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> bool:
    """Make VmHWM the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def warm_up(placement, a, checkpoint):
    """Both ways once on a tiny model, so lazy imports and once-per-process buffers are not counted."""
    import ds_hetero
    from ds_hetero.toy import tiny_llava

    for model, weights in ((tiny_llava("clip", vocab=256), None), (ds_hetero.meta_model(checkpoint), checkpoint)):
        engine = ds_hetero.initialize(model, ds_config(placement, a), weights=weights)
        engine.groups.destroy()
        del engine, model


def measure(rank, world, placement, mode, a, checkpoint, warm_checkpoint):
    """One rank of one row: build the model this row's way, initialize, report memory and reads."""
    import gc

    import ds_hetero

    warm_up(placement, a, warm_checkpoint)
    gc.collect()
    reset = reset_peak_rss()
    start_kb = _status_kb("VmRSS")
    if mode == "built":
        model, weights = build_model(a), None
    else:
        model, weights = ds_hetero.meta_model(checkpoint), checkpoint
    engine = ds_hetero.initialize(model, ds_config(placement, a), weights=weights)
    peak_kb = _status_kb("VmHWM")
    held = sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_meta)
    out = {
        "stages": sorted(engine.engines), "peak_over_start_mb": (peak_kb - start_kb) / 1024,
        "peak_mb": peak_kb / 1024, "start_mb": start_kb / 1024, "reset": reset, "held_mb": held / MB,
        "read": None if engine.load_report is None else {s: vars(r) | {"tensors": len(r.tensors)}
                                                         for s, r in engine.load_report.items()},
    }
    engine.groups.destroy()
    return out


def save_checkpoint(a, directory):
    """The model, once, as a sharded safetensors checkpoint; returns bytes per stage."""
    model = build_model(a)
    model.save_pretrained(directory, max_shard_size="100MB")
    sizes = {"vision": 0, "language": 0}
    for name, p in model.named_parameters():
        stage = "vision" if ("vision_tower" in name or "multi_modal_projector" in name) else "language"
        sizes[stage] += p.numel() * p.element_size()
    return sizes


def run(a, placements=tuple(PLACEMENTS), log=print):
    """{(placement, mode): [per-rank dict]} and the full model's bytes per stage."""
    from ds_hetero.toy import tiny_llava

    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench_loading_") as tmp:
        checkpoint, warm_checkpoint = os.path.join(tmp, "hf"), os.path.join(tmp, "warm")
        sizes = save_checkpoint(a, checkpoint)
        tiny_llava("clip", vocab=256).save_pretrained(warm_checkpoint)
        log(f"model: vision {sizes['vision'] / MB:.0f} MB, language {sizes['language'] / MB:.0f} MB (fp32)", flush=True)
        for placement in placements:
            for mode in MODES:
                t0 = time.perf_counter()
                rows[placement, mode] = launch(measure, placement, mode, a, checkpoint, warm_checkpoint)
                log(f"  {placement:13s} {mode:12s} done in {time.perf_counter() - t0:.0f} s", flush=True)
    return rows, sizes


def print_table(rows, sizes, log=print):
    full = (sizes["vision"] + sizes["language"]) / MB
    log(f"\npeak RSS over start while building model + engines, MB per rank (whole model {full:.0f} MB fp32)")
    log(f"{'placement':13s} {'rank':>4s} {'stages':16s} {'built':>8s} {'meta+w':>8s} {'held':>7s} "
        f"{'read vision':>11s} {'read lang':>9s} {'lang sharded read/full':>22s}")
    for placement in sorted({p for p, _ in rows}, key=list(PLACEMENTS).index):
        built, loaded = rows[placement, "built"], rows[placement, "meta+weights"]
        for rank in range(DEFAULT_WORLD):
            b, m = built[rank], loaded[rank]
            read = m["read"] or {}
            lang = read.get("language")
            shard = f"{lang['sharded_bytes_read'] / MB:.1f}/{lang['sharded_bytes_full'] / MB:.1f}" if lang else "-"
            log(f"{placement:13s} {rank:4d} {'+'.join(m['stages']):16s} {b['peak_over_start_mb']:8.0f} "
                f"{m['peak_over_start_mb']:8.0f} {m['held_mb']:7.0f} "
                f"{read.get('vision', {}).get('bytes_read', 0) / MB:11.1f} "
                f"{(lang['bytes_read'] / MB if lang else 0):9.1f} {shard:>22s}")
    if not all(r["reset"] for rs in rows.values() for r in rs):
        log("(the kernel refused to reset the peak: figures are peaks since the process started)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a ~30M-parameter model")
    for k, v in DEFAULTS.items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=None, help=f"default {v} ({QUICK[k]} with --quick)")
    p.add_argument("--placement", nargs="+", choices=list(PLACEMENTS), default=list(PLACEMENTS))
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    a = dict(QUICK if args.quick else DEFAULTS)
    a.update({k: getattr(args, k) for k in DEFAULTS if getattr(args, k) is not None})
    return args, a


def main(argv=None):
    args, a = parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    t0 = time.perf_counter()
    rows, sizes = run(a, args.placement)
    print_table(rows, sizes)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": a, "sizes": sizes, "rows": {f"{p} {m}": r for (p, m), r in rows.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
