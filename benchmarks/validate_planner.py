"""Does the planner rank layouts as they measure? Predicted vs measured order of one LLaVA on 4 and 2 ranks.

    .venv/bin/python benchmarks/validate_planner.py                 # both model sizes, 4 and 2 ranks; long on a loaded box
    .venv/bin/python benchmarks/validate_planner.py --quick         # small models, fewer rounds
    .venv/bin/python benchmarks/validate_planner.py --scenario balanced --world 2 --rounds 6

2 ranks, one per core (each rank bound to its own core with os.sched_setaffinity, so waiting is
real, not time-sharing), every row a planner candidate run through its own hetero_parallel
section: colocated vision dp2 + language dp2, vision dp2 + language tp2, vision tp2 + language
dp2, both stages tp2, disaggregated 1+1 (vision on rank 0, language on rank 1, 4 pipelined
micro-batches), vision dp2 + language pp2 (colocated, 4 micro-batches), the encoder in the first
pipeline stage (first_stage: vision on rank 0, language pp2, 4 micro-batches) with the even cut
and with a tuned cut (a quarter of the layers beside the encoder), plain DeepSpeed dp2; plus the
planner's pick over everything it searches (pipeline and first_stage rows included).

For each model size (bench_layouts' scenarios "balanced" and "large-vision"), the rows below run
through bench_layouts' own machinery: every row's engine in one set of 4 gloo processes, steps
round-robin (drift on a shared machine hits every row alike), median step time per row. The
rows are homogeneous (both stages tp2 dp2), homogeneous tp4 (both stages at the language's tp4),
four colocated heterogeneous layouts, two disaggregated 2+2 layouts (4 pipelined micro-batches),
plain ZeRO dp4 over the whole model and DeepSpeed's own AutoTP (autotp_size 2, vision tower
replicated), plus the planner's own top pick over all valid configurations when it is not one
of them.

The planner predicts every row with this machine's calibrated profile (`--machine calibrate`,
cached under ~/.cache/ds_hetero/) at the data's mean padded sequence length. Printed: the
table predicted vs measured (seconds and ranks), the Spearman rank correlation (target >= 0.8)
and whether the planner's top pick is within 10% of the best measured row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_layouts as bl  # noqa: E402

ROWS = ["homogeneous", "homogeneous tp4", "hetero tp2", "hetero tp4", "ds_hetero dp4", "hetero Vtp4",
        "disagg 2+2 tp", "disagg 2+2 dp", "plain DS dp4", "DS AutoTP tp2"]
PICK = "planner pick"
# 2-rank rows, as planner candidates (their config is the candidate's own hetero_parallel section)
PIPE_MB = 4  # micro-batches of the pipelined rows (a 2-stage 1F1B needs several to overlap)


def rows2(a):
    from ds_hetero.planner.candidate import Candidate, StageChoice

    layers = a["text_layers"]
    cut = (max(1, layers // 4), layers - max(1, layers // 4))  # the tuned cut: fewer layers beside the encoder
    one, two = StageChoice(1, 1), StageChoice(1, 2)
    out = {
        "2r V dp2 L dp2": Candidate("colocated", two, two, 1),
        "2r V dp2 L tp2": Candidate("colocated", two, StageChoice(2, 1), 1),
        "2r V tp2 L dp2": Candidate("colocated", StageChoice(2, 1), two, 1),
        "2r V tp2 L tp2": Candidate("colocated", StageChoice(2, 1), StageChoice(2, 1), 1),
        "2r disagg 1+1": Candidate("disaggregated", StageChoice(1, 1, ranks=(0,)), StageChoice(1, 1, ranks=(1,)),
                                   PIPE_MB),
        "2r V dp2 L pp2": Candidate("colocated", two, StageChoice(1, 1, pp=2), PIPE_MB),
        "2r first_stage even": Candidate("first_stage", one, StageChoice(1, 1, pp=2), PIPE_MB),
        "2r first_stage tuned": Candidate("first_stage", one, StageChoice(1, 1, pp=2), PIPE_MB, pp_layers=cut),
        "2r plain DS dp2": bl.Plain(),
    }
    return out


def pinned_interleaved(rank, world, names, a):
    """bench_layouts' interleaved rows with this rank bound to its own core."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    return bl.run_interleaved(rank, world, names, a)


def run_pinned(a, names, log=print):
    """All rows interleaved in one set of processes, one core per rank; per row the slowest rank's step times."""
    import time

    a = bl.with_param_counts(a)
    t0 = time.perf_counter()
    per_rank = bl.launch(pinned_interleaved, names, a, world=a["world"])
    a["interleaved_loss"] = per_rank[0][1]
    log(f"[{time.perf_counter() - t0:5.1f}s] interleaved rows done (one core per rank)", flush=True)
    return {n: [max(r[0][n][i] for r in per_rank) for i in range(len(per_rank[0][0][n]))] for n in names}, a


def spearman(xs, ys) -> float:
    """Spearman's rho with average ranks for ties."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def workload(a, model):
    """Mean padded length of the benchmark's samples (padding is to a rank's longest sample)."""
    from ds_hetero.planner.workload import Workload

    batches = bl.make_batches(model, a, 2)
    lengths = [int(s["input_ids"].numel()) for b in batches for s in b]
    seq = max(lengths)  # each rank pads its share to the longest sample in it
    k = (a["image_size"] // a["patch_size"]) ** 2
    return Workload(seq_len=seq, image_tokens=k, global_batch=a["batch"], dtype_bytes=4, zero=1)


def candidate_of(layout, a):
    from ds_hetero.planner.candidate import Candidate, StageChoice

    if isinstance(layout, Candidate):
        return layout
    (vtp, vdp), (ltp, ldp) = layout.vision, layout.language
    return Candidate(layout.placement, StageChoice(vtp, vdp, ranks=layout.vision_ranks or ()),
                     StageChoice(ltp, ldp, ranks=layout.language_ranks or ()), layout.micro_batches(a))


def predictions(a, rows, machine):
    """(predicted step seconds per row, the plan over every valid configuration)."""
    from ds_hetero.planner import plan
    from ds_hetero.planner.baselines import plain_deepspeed_step
    from ds_hetero.planner.step_model import predict
    from ds_hetero.planner.model_spec import model_spec

    model = bl.build_model(a)
    spec, wl = model_spec(model.config), workload(a, model)
    base = {k: v for k, v in bl.ds_config(a, bl.LAYOUTS["homogeneous"]).items() if k != "hetero_parallel"}
    full = plan(model, a["world"], wl.seq_len, wl.image_tokens, wl.global_batch, machine, base=base,
                micro_batches=(1, 2, 4))
    out = {}
    for name in rows:
        layout = bl.layout_of(name, a)
        if isinstance(layout, bl.Plain):
            out[name] = plain_deepspeed_step(spec, wl, machine, a["world"], layout.autotp, a["micro_batches"])
            continue
        out[name] = predict(candidate_of(layout, a), spec, wl, machine).step_s
    return out, full, wl


def _trial_rows(a, rows, predicted, full, k):
    """Row names of the planner's top K runnable candidates (trials.top_runnable, the candidates
    `--trial K` launches), each added as a row of its own unless a row already runs it."""
    from ds_hetero.planner.trials import top_runnable

    names = []
    for i, p in enumerate(top_runnable(full, k)):
        name = next((n for n in rows if not isinstance(bl.layout_of(n, a), bl.Plain)
                     and candidate_of(bl.layout_of(n, a), a) == p.candidate), None)
        if name is None:
            name = f"trial {i + 1}"
            a["extra_layouts"] = dict(a.get("extra_layouts", {}), **{name: p.candidate})
            rows.append(name)
            predicted[name] = p.step_s
        names.append(name)
    return names


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--scenario", nargs="+", default=["balanced", "large-vision"], choices=list(bl.SCENARIOS))
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 6, 3 with --quick)")
    p.add_argument("--recalibrate", action="store_true")
    p.add_argument("--world", nargs="+", type=int, default=[4, 2], choices=(2, 4))
    p.add_argument("--trial", type=int, default=0, metavar="K",
                   help="also measure the planner's top K runnable candidates (what `ds-hetero plan --trial K` "
                        "runs) in the same interleaved run, and report whether the fastest of them, the "
                        "trial's pick, is the best measured row")
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from ds_hetero.planner import machine_profile

    machine = machine_profile("calibrate", refresh=args.recalibrate, log=print)
    print(f"machine: {machine.source}; {machine.compute_units} cores")
    verdicts = []
    for world, scenario in [(w, s) for w in args.world for s in args.scenario]:
        a = dict(bl.QUICK if args.quick else bl.DEFAULTS)
        sc = bl.SCENARIOS[scenario]
        a.update(sc["quick_sizes"] if args.quick else sc["sizes"])
        a.update(seed=0, profile=False, rounds=args.rounds or (3 if args.quick else 6), world=world)
        rows = list(ROWS)
        if world == 2:
            a["extra_layouts"] = rows2(a)
            rows = list(a["extra_layouts"])
        predicted, full, wl = predictions(a, rows, machine)
        pick_pred = full.best if full.runnable else None  # any runnable candidate runs as a row (its own section)
        pick = pick_pred.candidate
        pick_name = next((n for n in rows if not isinstance(bl.layout_of(n, a), bl.Plain)
                          and candidate_of(bl.layout_of(n, a), a) == pick), None)
        if pick_name is None:
            a["extra_layouts"] = dict(a.get("extra_layouts", {}), **{PICK: pick})
            rows.append(PICK)
            pick_name = PICK
            predicted[PICK] = pick_pred.step_s
        trial_names = _trial_rows(a, rows, predicted, full, args.trial) if args.trial else []
        print(f"\n== {world} ranks, {scenario}: {sc['about']}; seq {wl.seq_len}, {wl.image_tokens} image tokens, batch "
              f"{wl.global_batch}; planner's pick over {len(full.predictions)} valid configurations: "
              f"{pick.label()} (row {pick_name!r})", flush=True)
        print(f"load average before: {os.getloadavg()}", flush=True)
        if world == 2:
            paired, a = run_pinned(a, rows)
        else:
            _, paired, a = bl.run_benchmark(a, rows, interleaved=True, fresh=[], log=print)
        print(f"load average after: {os.getloadavg()}", flush=True)
        measured = {n: statistics.median(ts) for n, ts in paired.items()}
        names = [n for n in rows if n in measured]
        pr = sorted(names, key=lambda n: predicted[n])
        mr = sorted(names, key=lambda n: measured[n])
        print(f"{'row':<16} {'layout':<34} {'predicted s':>11} {'measured s':>10} {'pred #':>6} {'meas #':>6}")
        for n in pr:
            print(f"{n:<16} {bl.layout_str(bl.layout_of(n, a), world):<34} {predicted[n]:>11.3f} {measured[n]:>10.3f} "
                  f"{pr.index(n) + 1:>6} {mr.index(n) + 1:>6}")
        rho = spearman([predicted[n] for n in names], [measured[n] for n in names])
        best = min(measured.values())
        within = measured[pick_name] / best
        losses = a.get("interleaved_loss", {})
        same_loss = max(losses.values()) - min(losses.values()) < 1e-4 * abs(min(losses.values())) if losses else None
        print(f"Spearman rank correlation {rho:.2f} (target >= 0.8); planner's pick {pick_name!r} measured "
              f"{measured[pick_name]:.3f} s = {within:.2f}x the best measured ({mr[0]!r}, {best:.3f} s); "
              f"{'within' if within <= 1.10 else 'NOT within'} 10%; first-step loss equal on every row: {same_loss}")
        if trial_names:
            fastest = min(trial_names, key=lambda n: measured[n])
            print(f"--trial {args.trial}: the top {len(trial_names)} runnable candidates are rows {trial_names}; the "
                  f"fastest of them, the trial's pick, is {fastest!r} at {measured[fastest]:.3f} s = "
                  f"{measured[fastest] / best:.2f}x the best measured row ({mr[0]!r})")
        verdicts.append((f"{world} ranks {scenario}", rho, within))
    print("\nsummary: " + "; ".join(f"{s}: rho {r:.2f}, pick {w:.2f}x best" for s, r, w in verdicts))


if __name__ == "__main__":
    main()
