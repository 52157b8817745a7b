"""Plugin overhead: ds_hetero against plain DeepSpeed at the same layout (dpN), and where the difference goes.

    .venv/bin/python benchmarks/bench_overhead.py                 # bench_layouts' default and --quick sizes, one rank per core
    .venv/bin/python benchmarks/bench_overhead.py --sizes quick   # one size only (2 ranks on a 2-core machine, else 4)
    .venv/bin/python benchmarks/bench_overhead.py --sizes quick --world 4   # 4 ranks even on 2 cores, for the record
    .venv/bin/python benchmarks/bench_overhead.py --sizes quick --world 2 --deepspeed-norms   # + DeepSpeed's own stage norms
    .venv/bin/python benchmarks/bench_overhead.py --sizes quick --two-engines   # + plain DeepSpeed with one engine per stage

The same seeded LLaVA (bench_layouts' "balanced" scenario), the same global batches, ZeRO 1,
AdamW, clipping 1.0, on N CPU ranks: "ds_hetero dpN" (vision tp1 dpN + language tp1 dpN,
colocated: the stages share one DeepSpeed engine (stages/shared_engine.py), a boundary that moves
nothing) against "plain DS dpN" (one
`deepspeed.initialize` over the whole model, benchmarks/layouts_plain.py). Both engines live in
ONE set of processes and step round-robin (each row first in turn), so a shared machine's drift
hits both alike. Each rank is bound to its own core (`os.sched_setaffinity`), so a rank waiting in a
collective waits for real instead of handing its core to another rank; on fewer than 4 cores the
default is therefore the same rows at dp2 on 2 ranks (`--world 4` there measures 4 ranks on 2
cores, where every collective also waits for a descheduled peer and costs context switches).

With `--two-engines` a third row, "plain DS dpN, two engines", steps plain DeepSpeed with one engine
per stage module (layouts_plain.PlainTwoEngines: no batch agreement, plan, boundary or global
norm): ds_hetero / plain then splits into that row over plain (what a second DeepSpeed engine
costs by itself) and ds_hetero over that row (what ds_hetero's own step adds). Every row's first
loss (the same batch, the same weights, before any update) is checked equal.

Reported per size:
- wall time per step (the slowest rank, from a common barrier) and the median of the per-round
  ratios ds_hetero / plain: the overhead a user sees;
- CPU seconds per step (all ranks, time.process_time): robust to other jobs on the machine, since
  a rank waiting in a gloo collective sleeps; and per rank its CPU and wall medians (wall minus
  CPU is its waiting);
- where ds_hetero's CPU time goes against plain DeepSpeed's, phase by phase (cProfile on CPU time,
  rank 0, over as many further rounds: the timed rounds run unprofiled): model forward, backward,
  the boundary exchange, the gradient norm, the optimizer step,
  the batch agreement and the step plan, and the rest.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the layouts_* modules beside this script

from bench_layouts import parse_args as layouts_args  # noqa: E402
from cpu_ranks import launch  # noqa: E402
from layouts_measure import make_engine  # noqa: E402
from layouts_rows import Layout, Plain, make_batches  # noqa: E402

ROWS = ("ds_hetero dp4", "plain DS dp4")  # the names bench_layouts knows; --world renames them (rows_of)


def cores() -> int:
    """The cores this process may run on (the ranks are bound one per core where they fit)."""
    return len(os.sched_getaffinity(0))


def rows_of(world: int) -> tuple[str, str]:
    return (f"ds_hetero dp{world}", f"plain DS dp{world}")


def ds_norms_row(world: int) -> str:
    return f"{rows_of(world)[0]} (DS norms)"


def two_engines_row(world: int) -> str:
    return f"{rows_of(world)[1]}, two engines"


def timed_rows(world: int, deepspeed_norms: bool, two_engines: bool = False) -> tuple[str, ...]:
    """The rows stepped every round: ds_hetero and plain DeepSpeed; with `--deepspeed-norms` a
    second ds_hetero engine whose stage norms are DeepSpeed's own (no rank shares: the step as it
    was before optimizer_step/norm_shares.py), to read that change from the same rounds; with
    `--two-engines` plain DeepSpeed with one engine per stage module (layouts_plain.PlainTwoEngines),
    which splits the overhead into what a second DeepSpeed engine costs and what ds_hetero's own
    step adds."""
    return (rows_of(world) + ((ds_norms_row(world),) if deepspeed_norms else ())
            + ((two_engines_row(world),) if two_engines else ()))


def layouts_of(world: int) -> dict:
    hetero, plain = rows_of(world)
    return {hetero: Layout((1, world), (1, world)), plain: Plain(),
            two_engines_row(world): Plain(two_engines=True)}

# phase -> functions (file suffix, name) whose cumulative CPU time it is, for each engine. Nested
# entries are subtracted where one phase runs inside another (the boundary's backward exchange
# runs inside the encoder's backward; the norm inside plain DeepSpeed's step).
HETERO_PHASES = {
    "forward (encoder + language + loss)": [("schedule/stage_work.py", "encoder_forward"),
                                            ("schedule/stage_work.py", "language_loss_sum")],
    "backward": [("stages/stage_set.py", "backward")],
    "boundary exchange": [("schedule/stage_work.py", "send_rows"), ("boundary/communicator.py", "_run_backward")],
    "gradient norm": [("optimizer_step/global_step.py", "stage_norms"), ("optimizer_step/global_step.py", "combine_norms_and_loss")],
    "optimizer step": [("optimizer_step/global_step.py", "step_all"), ("stages/stage_set.py", "micro_step")],
    "batch agreement + step plan": [("ds_hetero/engine.py", "_agree_on_batch"), ("step/step_plan.py", "__init__")],
}
PLAIN_PHASES = {
    "forward (encoder + language + loss)": [("deepspeed/runtime/engine.py", "forward"), ("ds_hetero/loss.py", "token_loss_sum")],
    "backward": [("deepspeed/runtime/engine.py", "backward")],
    "boundary exchange": [],
    "gradient norm": [("deepspeed/runtime/zero/stage_1_and_2.py", "scaled_global_norm")],
    "optimizer step": [("deepspeed/runtime/engine.py", "step")],
    "batch agreement + step plan": [("ds_hetero/loss.py", "label_token_count")],
}
NESTED = {  # (engine, phase) -> the phase whose time it contains and must not count twice
    ("hetero", "backward"): [("boundary/communicator.py", "_run_backward")],
    ("plain", "optimizer step"): [("deepspeed/runtime/zero/stage_1_and_2.py", "scaled_global_norm")],
}


def _cum(stats: pstats.Stats, where: list[tuple[str, str]], steps: int) -> float:
    """Milliseconds per step inside the named functions (cumulative, each counted once)."""
    total = 0.0
    for (filename, _, name), (_, _, _, cumtime, _) in stats.stats.items():
        if any(filename.endswith(suffix) and name == fn for suffix, fn in where):
            total += cumtime
    return 1000 * total / steps


def breakdown(stats: pstats.Stats, which: str, steps: int) -> dict[str, float]:
    phases = HETERO_PHASES if which == "hetero" else PLAIN_PHASES
    out = {phase: _cum(stats, where, steps) - _cum(stats, NESTED.get((which, phase), []), steps)
           for phase, where in phases.items()}
    total = 1000 * stats.total_tt / steps
    out["other (host work, spans, Python)"] = total - sum(out.values())
    out["total"] = total
    return out


def run(rank, world, a, steps):
    """Both engines in this process, stepped round-robin; per-step wall and CPU, rank 0's profiles."""
    import torch.distributed as dist

    if world <= cores():  # one rank per core: waiting is real
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    rows, timed = rows_of(world), timed_rows(world, a["deepspeed_norms"], a["two_engines"])
    engines = {}
    for name in timed:
        model, engine = make_engine(rows[0] if name == ds_norms_row(world) else name, a)
        if hasattr(engine, "timeline"):
            engine.timeline.synchronize = False  # as in training: no device sync per span
        if name == ds_norms_row(world):
            engine.norm_sharing = frozenset()  # every stage's norm from DeepSpeed's scaled_global_norm
        engines[name] = engine
    batches = make_batches(model, a, 2 * steps + 2)
    first = {}
    for b in batches[:2]:  # warm-up: DeepSpeed's first steps allocate
        for name, engine in engines.items():
            result = engine.train_batch(b)
            first.setdefault(name, result["loss"] if isinstance(result, dict) else result.loss)
    # every row trains the same model from the same weights: the first batch's loss (before any
    # update) is the same, or a row measures something else
    if max(first.values()) - min(first.values()) > 1e-5 * abs(first[rows[1]]):
        raise AssertionError(f"the rows' first losses differ: {first}")
    # the timed rounds run without the profiler (it costs per Python call, and ds_hetero makes more
    # of them than plain DeepSpeed: profiled, the ratio reads high); the profiled rounds follow
    profiles = {name: cProfile.Profile(time.process_time) for name in rows}
    rounds = []
    for i, b in enumerate(batches[2:]):
        order = timed[i % len(timed):] + timed[:i % len(timed)]  # each row first in turn
        rec = {}
        for name in order:
            profile = profiles.get(name) if i >= steps else None
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            if profile:
                profile.enable()
            engines[name].train_batch(b)
            if profile:
                profile.disable()
            rec[name] = (time.perf_counter() - t0, time.process_time() - c0)
        if i < steps:
            rounds.append(rec)
    out = {"rounds": rounds}
    if rank == 0:
        out["breakdown"] = {name: breakdown(pstats.Stats(profiles[name]), "hetero" if name == rows[0] else "plain",
                                            steps) for name in rows}
    return out


def _rank_medians(per_rank: list[dict], row: str, steps: int) -> list[tuple[float, float]]:
    """Per rank, its median (wall, CPU) milliseconds of a step of `row` over the timed rounds."""
    return [tuple(1000 * statistics.median(r["rounds"][i][row][k] for i in range(steps)) for k in (0, 1))
            for r in per_rank]


def report(size: str, a: dict, per_rank: list[dict], steps: int) -> None:
    rows, timed = rows_of(a["world"]), timed_rows(a["world"], a["deepspeed_norms"], a["two_engines"])
    binding = "one per core" if a["world"] <= cores() else f"on {cores()} cores"
    wall = {n: [max(r["rounds"][i][n][0] for r in per_rank) for i in range(steps)] for n in timed}
    cpu = {n: [sum(r["rounds"][i][n][1] for r in per_rank) for i in range(steps)] for n in timed}
    ratio = [wall[rows[0]][i] / wall[rows[1]][i] for i in range(steps)]
    cpu_ratio = [cpu[rows[0]][i] / cpu[rows[1]][i] for i in range(steps)]
    print(f"\n== {size} sizes (vision {a['vision_hidden']}x{a['vision_layers']}, language "
          f"{a['text_hidden']}x{a['text_layers']}, {a['image_size']} px, batch {a['batch']}), {a['world']} ranks "
          f"{binding}, {steps} rounds; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'row':<30}{'wall s/step':>12}{'min':>8}{'CPU s/step':>12}")
    for n in timed:
        print(f"{n:<30}{statistics.median(wall[n]):>12.3f}{min(wall[n]):>8.3f}{statistics.median(cpu[n]):>12.3f}")
    print(f"overhead ds_hetero / plain DeepSpeed: wall {statistics.median(ratio):.3f} (median of per-round ratios; "
          f"fastest steps {min(wall[rows[0]]) / min(wall[rows[1]]):.3f}), CPU {statistics.median(cpu_ratio):.3f} "
          f"(cheapest steps {min(cpu[rows[0]]) / min(cpu[rows[1]]):.3f}: other jobs only add)")
    # per rank: a wall time above the CPU time is waiting (in collectives, or descheduled); a gap
    # between the rows that shows in CPU and not in waiting is work, which no reordering of syncs hides
    print("per rank, medians (ms/step): " + "; ".join(
        f"{n} " + ", ".join(f"r{r} CPU {cpu_ms:.1f} wall {wall_ms:.1f}"
                            for r, (wall_ms, cpu_ms) in enumerate(_rank_medians(per_rank, n, steps))) for n in rows))
    for n in timed[2:]:
        print(f"{n} / plain DeepSpeed: wall {statistics.median(w / p for w, p in zip(wall[n], wall[rows[1]])):.3f}, "
              f"CPU {statistics.median(c / p for c, p in zip(cpu[n], cpu[rows[1]])):.3f} (the same rounds)")
    if a["two_engines"]:  # the overhead split: a second engine's cost, then what ds_hetero's step adds to it
        two = two_engines_row(a["world"])
        print(f"ds_hetero / {two}: wall {statistics.median(h / t for h, t in zip(wall[rows[0]], wall[two])):.3f}, "
              f"CPU {statistics.median(h / t for h, t in zip(cpu[rows[0]], cpu[two])):.3f} (the same rounds)")
        print(f"per rank, medians (ms/step): {two} " + ", ".join(
            f"r{r} CPU {cpu_ms:.1f} wall {wall_ms:.1f}" for r, (wall_ms, cpu_ms) in enumerate(_rank_medians(per_rank, two, steps))))
    hetero, plain = (per_rank[0]["breakdown"][n] for n in rows)
    print(f"\nwhere the CPU time goes, rank 0, ms per step:\n{'phase':<38}{'ds_hetero':>10}{'plain DS':>10}{'diff':>8}")
    for phase in hetero:
        print(f"{phase:<38}{hetero[phase]:>10.1f}{plain[phase]:>10.1f}{hetero[phase] - plain[phase]:>+8.1f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", choices=["default", "quick"], default=["default", "quick"])
    p.add_argument("--steps", type=int, default=None,
                   help="measured rounds (each steps both engines once); default 60 at the quick sizes, 20 at the "
                        "default ones: fewer rounds scatter a run's median by about +-0.05 on a shared machine")
    p.add_argument("--world", type=int, default=None, choices=[2, 4],
                   help="ranks (dp of both rows); default 4 where there are 4 cores, else 2: one rank per core, "
                        "each bound to its own (4 on 2 cores measures descheduled peers, for the record)")
    p.add_argument("--deepspeed-norms", action="store_true",
                   help="also step a ds_hetero engine with DeepSpeed's own stage norms (no rank shares)")
    p.add_argument("--two-engines", action="store_true",
                   help="also step plain DeepSpeed with one engine per stage module (what a second engine costs)")
    args = p.parse_args(argv)
    if args.world is None:  # a claim about waiting holds only with a core per rank (docs/benchmarks.md)
        args.world = 4 if cores() >= 4 else 2
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for size in args.sizes:
        _, runs = layouts_args((["--quick"] if size == "quick" else []) + ["--scenario", "balanced", "--rows", *ROWS])
        a = dict(runs[0][1], world=args.world, extra_layouts=layouts_of(args.world),
                 deepspeed_norms=args.deepspeed_norms, two_engines=args.two_engines)
        steps = args.steps or (60 if size == "quick" else 20)
        per_rank = launch(run, a, steps, world=args.world, timeout=3600.0)
        report(size, a, per_rank, steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
