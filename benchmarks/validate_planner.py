"""Does the planner rank layouts as they measure? Predicted vs measured order of one LLaVA on 4 ranks.

    python recipes/validate_planner.py                 # both model sizes, ~15 min on a loaded 2-core box
    python recipes/validate_planner.py --quick         # small models, fewer rounds
    python recipes/validate_planner.py --scenario balanced --rounds 6

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

    (vtp, vdp), (ltp, ldp) = layout.vision, layout.language
    return Candidate(layout.placement, StageChoice(vtp, vdp, ranks=layout.vision_ranks or ()),
                     StageChoice(ltp, ldp, ranks=layout.language_ranks or ()), layout.micro_batches(a))


def layout_of_candidate(c):
    return bl.Layout((c.vision.tp, c.vision.dp), (c.language.tp, c.language.dp), c.placement,
                     c.vision.ranks or None, c.language.ranks or None, mb=c.micro_batches)


def predictions(a, rows, machine):
    """(predicted step seconds per row, the plan over every valid configuration)."""
    from ds_hetero.config import parse_config
    from ds_hetero.planner import plan
    from ds_hetero.planner.baselines import plain_deepspeed_step
    from ds_hetero.planner.cost import predict
    from ds_hetero.planner.model_spec import model_spec

    model = bl.build_model(a)
    spec, wl = model_spec(model.config), workload(a, model)
    base = {k: v for k, v in bl.ds_config(a, bl.LAYOUTS["homogeneous"]).items() if k != "hetero_parallel"}
    full = plan(model, bl.WORLD, wl.seq_len, wl.image_tokens, wl.global_batch, machine, base=base,
                micro_batches=(1, 2, 4))
    out = {}
    for name in rows:
        layout = bl.layout_of(name, a)
        if isinstance(layout, bl.Plain):
            out[name] = plain_deepspeed_step(spec, wl, machine, bl.WORLD, layout.autotp, a["micro_batches"])
            continue
        cand = candidate_of(layout, a)
        out[name] = predict(cand, parse_config(cand.ds_config(base), bl.WORLD), spec, wl, machine).step_s
    return out, full, wl


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--scenario", nargs="+", default=["balanced", "large-vision"], choices=list(bl.SCENARIOS))
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 6, 3 with --quick)")
    p.add_argument("--recalibrate", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from ds_hetero.planner import machine_profile

    machine = machine_profile("calibrate", refresh=args.recalibrate, log=print)
    print(f"machine: {machine.source}; {machine.compute_units} cores")
    verdicts = []
    for scenario in args.scenario:
        a = dict(bl.QUICK if args.quick else bl.DEFAULTS)
        sc = bl.SCENARIOS[scenario]
        a.update(sc["quick_sizes"] if args.quick else sc["sizes"])
        a.update(seed=0, profile=False, rounds=args.rounds or (3 if args.quick else 6))
        rows = list(ROWS)
        predicted, full, wl = predictions(a, rows, machine)
        pick = full.best.candidate
        pick_name = next((n for n in rows if not isinstance(bl.layout_of(n, a), bl.Plain)
                          and candidate_of(bl.layout_of(n, a), a) == pick), None)
        if pick_name is None:
            a["extra_layouts"] = {PICK: layout_of_candidate(pick)}
            rows.append(PICK)
            pick_name = PICK
            predicted[PICK] = full.best.step_s
        print(f"\n== {scenario}: {sc['about']}; seq {wl.seq_len}, {wl.image_tokens} image tokens, batch "
              f"{wl.global_batch}; planner's pick over {len(full.predictions)} valid configurations: "
              f"{pick.label()} (row {pick_name!r})", flush=True)
        _, paired, a = bl.run_benchmark(a, rows, interleaved=True, fresh=[], log=print)
        measured = {n: statistics.median(ts) for n, ts in paired.items()}
        names = [n for n in rows if n in measured]
        pr = sorted(names, key=lambda n: predicted[n])
        mr = sorted(names, key=lambda n: measured[n])
        print(f"{'row':<16} {'layout':<34} {'predicted s':>11} {'measured s':>10} {'pred #':>6} {'meas #':>6}")
        for n in pr:
            print(f"{n:<16} {bl.layout_str(bl.layout_of(n, a)):<34} {predicted[n]:>11.3f} {measured[n]:>10.3f} "
                  f"{pr.index(n) + 1:>6} {mr.index(n) + 1:>6}")
        rho = spearman([predicted[n] for n in names], [measured[n] for n in names])
        best = min(measured.values())
        within = measured[pick_name] / best
        losses = a.get("interleaved_loss", {})
        same_loss = max(losses.values()) - min(losses.values()) < 1e-4 * abs(min(losses.values())) if losses else None
        print(f"Spearman rank correlation {rho:.2f} (target >= 0.8); planner's pick {pick_name!r} measured "
              f"{measured[pick_name]:.3f} s = {within:.2f}x the best measured ({mr[0]!r}, {best:.3f} s); "
              f"{'within' if within <= 1.10 else 'NOT within'} 10%; first-step loss equal on every row: {same_loss}")
        verdicts.append((scenario, rho, within))
    print("\nsummary: " + "; ".join(f"{s}: rho {r:.2f}, pick {w:.2f}x best" for s, r, w in verdicts))


if __name__ == "__main__":
    main()
