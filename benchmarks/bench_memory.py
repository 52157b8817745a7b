"""Per-stage memory controls: peak memory per rank and step time of LLaVA, one row per setting.

    .venv/bin/python benchmarks/bench_memory.py            # LLaVA, text 512 x 4 layers, CLIP 256 x 4 layers, 100 tokens/image
    .venv/bin/python benchmarks/bench_memory.py --quick    # a smaller LLaVA, fewer steps (a few minutes on a loaded machine)
    .venv/bin/python benchmarks/bench_memory.py --batch 64 --rows "base,recompute lang,recompute both,vision frozen"

Every row trains the same seeded LLaVA on the same synthetic batches on 4 ranks (vision tp1 dp4 +
language tp2 cp2 with sequence parallelism, colocated, global batch 16 in 2 micro-batches, AdamW,
clipping 1.0):

    base              ZeRO 1 everywhere, no recompute, everything trains
    recompute lang    stages.language.recompute true
    recompute vision  stages.vision.recompute true
    recompute both    both
    zero 3 all        zero_optimization.stage 3 for both stages
    zero 3 vision     stages.vision.zero_stage 3, the language stage at ZeRO 1
    tower frozen      stages.vision.freeze ["tower"] (the projector trains)
    vision frozen     stages.vision.freeze true (no vision optimizer, no boundary backward)

Each row runs in its own 4 fresh processes (memory is per process); the rows are interleaved
over `--rounds` rounds in alternating order (A B C .., .. C B A) so that the drift of a shared
machine hits every row alike. Per row: peak memory per rank during training (accelerator:
`max_memory_allocated` after a reset; CPU: the resident-set high-water mark VmHWM after a reset
through /proc/self/clear_refs) and its growth over the memory resident before the timed steps
(activations, gradients, optimizer temporaries), the median step time (slowest rank) and the
boundary bytes all ranks sent in backward exchanges per step (0 when the vision stage is
frozen: checked). Medians over the rounds; ratios to the "base" row.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the launcher beside this script

from cpu_ranks import launch  # noqa: E402  (4 fresh gloo processes from a preloaded forkserver)
from process_memory import reset_peak, status_kib  # noqa: E402

# the language sequence sharded over tp (sp) and cp: every language rank takes rows of every vision
# rank, so the boundary's backward moves bytes (colocated tp2 dp2 would keep them all local)
VISION, LANGUAGE = {"tp": 1, "dp": 4}, {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}
ROWS = {  # name: (vision options, language options, zero_optimization.stage)
    "base": ({}, {}, 1),
    "recompute lang": ({}, {"recompute": True}, 1),
    "recompute vision": ({"recompute": True}, {}, 1),
    "recompute both": ({"recompute": True}, {"recompute": True}, 1),
    "zero 3 all": ({}, {}, 3),
    "zero 3 vision": ({"zero_stage": 3}, {}, 1),
    "tower frozen": ({"freeze": ["tower"]}, {}, 1),
    "vision frozen": ({"freeze": True}, {}, 1),
}
SIZES = {  # tiny_llava keyword arguments
    "full": dict(text_hidden=512, text_layers=4, text_heads=8, text_kv_heads=4, vocab=1024, vision_hidden=256,
                 vision_layers=4, vision_heads=4, image_size=80, patch_size=8),
    "quick": dict(text_hidden=256, text_layers=2, text_heads=4, text_kv_heads=4, vocab=512, vision_hidden=128,
                  vision_layers=2, vision_heads=4, image_size=64, patch_size=8),
}


def _reset_peak(device) -> int:
    """Reset this process's peak memory; return what is resident now (bytes)."""
    gc.collect()
    if device.type != "cpu":
        from deepspeed.accelerator import get_accelerator

        get_accelerator().reset_peak_memory_stats()
        return get_accelerator().memory_allocated()
    reset_peak()
    return status_kib("VmRSS") * 1024


def _peak(device) -> int:
    if device.type != "cpu":
        from deepspeed.accelerator import get_accelerator

        return get_accelerator().max_memory_allocated()
    return status_kib("VmHWM") * 1024


def _row(rank, world, name, size, steps, batch):
    import torch
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.toy import ShapesCaptionDataset
    from ds_hetero.toy import tiny_llava

    vision, language, zero = ROWS[name]
    config = {
        "train_batch_size": batch, "zero_optimization": {"stage": zero}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}, "steps_per_print": 10**6,
        "hetero_parallel": {"micro_batches": 2, "stages": {"vision": {**VISION, **vision},
                                                           "language": {**LANGUAGE, **language}}},
    }
    model = tiny_llava("clip", seed=0, **SIZES[size])
    dataset = ShapesCaptionDataset.for_llava(model.config, size=batch * (steps + 1), seed=0)
    engine = ds_hetero.initialize(model, config, training_data=dataset, seed=0)
    engine.train_batch()  # warm-up: optimizer state allocated, first-step checks done
    base = _reset_peak(engine.device)
    results = [engine.train_batch() for _ in range(steps)]
    peak = _peak(engine.device)
    times = torch.tensor([r.step_time for r in results], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank's step
    backward = torch.tensor([sum(r.boundary_bytes_backward for r in results)], dtype=torch.float64)
    dist.all_reduce(backward)
    engine.groups.destroy()
    return {"peak": peak, "growth": peak - base, "step": statistics.median(times.tolist()),
            "backward_bytes": backward.item() / steps, "loss": results[-1].loss}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names")
    p.add_argument("--batch", type=int, default=16, help="global batch (more: activations weigh more)")
    args = p.parse_args(argv)
    size = "quick" if args.quick else "full"
    rounds = args.rounds or (1 if args.quick else 2)
    steps = args.steps or (2 if args.quick else 3)
    rows = [r.strip() for r in args.rows.split(",")]
    runs: dict[str, list] = {r: [] for r in rows}
    for k in range(rounds):
        for name in (rows if k % 2 == 0 else rows[::-1]):
            out = launch(_row, name, size, steps, args.batch)
            runs[name].append(out)
            print(f"round {k} {name}: step {max(o['step'] for o in out):.3f} s, peak "
                  f"{[round(o['peak'] / 2**20) for o in out]} MiB", flush=True)
    from ds_hetero.toy import tiny_llava

    n = sum(p.numel() for p in tiny_llava("clip", **SIZES[size]).parameters())
    print(f"\nLLaVA ({size}: {n / 1e6:.1f} M parameters), vision tp1 dp4 + language tp2 cp2 sp, global batch {args.batch}, "
          f"2 micro-batches, {steps} timed steps x {rounds} rounds; memory per rank in MiB")
    header = (f"{'row':<18}{'peak per rank':<26}{'growth per rank':<26}{'max peak':>9}{'x base':>8}"
              f"{'step s':>9}{'x base':>8}{'bwd bytes/step':>16}")
    print(header)
    print("-" * len(header))
    ref = None
    for name in rows:
        per_round = runs[name]
        peak = [statistics.median(r[i]["peak"] for r in per_round) / 2**20 for i in range(4)]
        growth = [statistics.median(r[i]["growth"] for r in per_round) / 2**20 for i in range(4)]
        step = statistics.median(max(o["step"] for o in r) for r in per_round)
        bwd = statistics.median(r[0]["backward_bytes"] for r in per_round)
        if name == "vision frozen":
            assert bwd == 0, f"a frozen vision stage sent {bwd} bytes in backward exchanges"
        elif name == "base":
            assert bwd > 0, "the trainable vision stage's backward exchange sent nothing: the check above is void"
        ref = ref or (max(peak), step)
        print(f"{name:<18}{str([round(x) for x in peak]):<26}{str([round(x) for x in growth]):<26}"
              f"{max(peak):>9.0f}{max(peak) / ref[0]:>8.2f}{step:>9.3f}{step / ref[1]:>8.2f}{bwd:>16,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
