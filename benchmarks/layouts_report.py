"""bench_layouts' report: the per-row tables (step time, tokens/s, bubble, CPU, memory, time split per
rank set, profile) and the interleaved table with the speedups and the plugin-overhead ratio."""

from __future__ import annotations

import os
import statistics
from collections import defaultdict

from layouts_rows import BASELINE, LAYOUTS, SCENARIOS, layout_str, mb_of, ranks_str


SHORT = {"vision.forward": "V fwd", "vision.backward": "V bwd", "boundary.rows": "bnd rows",
         "boundary.grads": "bnd grads", "boundary.combine": "bnd sync", "language.forward": "L fwd",
         "language.backward": "L bwd",
         "model.forward": "fwd", "model.backward": "bwd", "optimizer": "optim"}


def print_table(rows, paired, a, scenario=None):
    base = next((r for r in rows if r["name"] == BASELINE), rows[0])
    cores = len(os.sched_getaffinity(0))
    print()
    if scenario:
        print(f"== scenario {scenario}: {SCENARIOS[scenario]['about'] if scenario in SCENARIOS else ''}")
    print(f"model: LLaVA (CLIP {a['vision_layers']}x{a['vision_hidden']}, {a['image_size']}px/{a['patch_size']} -> "
          f"{(a['image_size'] // a['patch_size']) ** 2} image tokens; Llama {a['text_layers']}x{a['text_hidden']}); "
          f"{a['vision_params'] / 1e6:.2f}M vision + {a['text_params'] / 1e6:.2f}M language params; "
          f"global batch {a['batch']}, ZeRO 1, fp32, AdamW")
    print(f"{a['world']} CPU ranks (gloo, 1 thread each) on {cores} cores; median of {a['steps']} steps after "
          f"{a['warmup']} warm-up, per step the slowest rank; mb = micro-batches (gradient accumulation; "
          f"disaggregated rows pipeline them)")
    head = (f"{'row':<15} {'layout':<26} {'mb':>2} {'step s':>6} {'min-max':>11} {'tok/s':>6} {'tok/s/rank':>10} "
            f"{'label tok/s':>11} {'vs homog.':>9} {'bubble %/rank':>15} {'CPU s':>6} {'util':>5} {'loss@1':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        bub = "/".join(f"{100 * b:.0f}" for b in r["bubble"]) if r["bubble"][0] is not None else "-"
        print(f"{r['name']:<15} {layout_str(r['layout'], a['world']):<26} {r['micro_batches']:>2} {r['step_s']:>6.2f} "
              f"{r['step_min']:>5.2f}-{r['step_max']:<5.2f} {r['all_tok_s']:>6.0f} {r['all_tok_s'] / a['world']:>10.0f} "
              f"{r['label_tok_s']:>11.1f} {base['step_s'] / r['step_s']:>8.2f}x {bub:>15} {r['cpu_s']:>6.2f} "
              f"{r['util']:>5.2f} {r['first_loss']:>8.4f}")
    print("tok/s = all tokens (text + image placeholders) per second, /rank = over the 4 ranks; vs homog. = "
          "homogeneous step time / row step time (= the tokens/s ratio); bubble = 1 - busy / step time per rank "
          "(StepResult.bubble_fraction: time outside forward, backward and optimizer, i.e. waiting at the "
          f"boundary); CPU s = CPU seconds per step, all ranks; util = CPU s / (step s x {cores} cores)")
    print()
    _print_memory(rows, base)
    _print_split(rows)
    _print_profile(rows, a)
    _print_paired(paired, a)


def _print_memory(rows, base):
    """Parameters and peak memory per rank, and the boundary's bytes."""
    head = (f"{'row':<15} {'params M/rank':>23} {'peak RSS MB/rank':>23} {'+over start MB/rank':>23} "
            f"{'max +over':>9} {'vs homog.':>9} {'boundary MB':>11}")
    print(head)
    print("-" * len(head))
    def over(r):
        return [p - s for p, s in zip(r["peak_rss"], r["start_rss"])]
    for r in rows:
        print(f"{r['name']:<15} {'/'.join(f'{x / 1e6:.2f}' for x in r['params']):>23} "
              f"{'/'.join(f'{x:.0f}' for x in r['peak_rss']):>23} "
              f"{'/'.join(f'{x:.0f}' for x in over(r)):>23} {max(over(r)):>9.0f} "
              f"{max(over(r)) / max(over(base)):>8.2f}x {r['boundary_bytes'] / 2**20:>11.2f}")
    print("params = parameters each rank holds (tp shards; a disaggregated rank holds one stage); "
          "peak RSS = max RSS of each rank's process (includes the libraries); +over start = peak minus the RSS "
          "before the model was built (every rank first builds the whole model; disaggregated ranks then move the "
          "other stage to the meta device); boundary MB = all ranks, forward + backward, per step")
    print()



def _print_split(rows):
    """Seconds per step of each phase on each rank set."""
    def rank_of(word, order):
        return order.index(word) if word in order else len(order)

    phases = sorted({k for r in rows for g in r["groups"].values() for k in g["split"]}, key=lambda k: (
        rank_of(k.split(".")[0], ["vision", "boundary", "language", "model", "optimizer"]),
        rank_of(k.partition(".")[2], ["forward", "rows", "grads", "backward"]), k))
    print("time split, seconds per step on each rank set (mean over its ranks of per-rank medians); busy = forward "
          "+ backward + optimizer; CPU = CPU seconds per rank and step:")
    head = (f"{'row':<15} {'ranks':<12} " + " ".join(f"{SHORT.get(p, p):>9}" for p in phases)
            + f" {'busy':>6} {'CPU':>6} {'bubble':>6} {'step':>6}")
    print(head)
    for r in rows:
        for label, g in r["groups"].items():
            busy = sum(v for k, v in g["split"].items() if not k.startswith("boundary"))
            bub = f"{100 * g['bubble']:>5.0f}%" if g["bubble"] is not None else f"{'-':>6}"
            print(f"{r['name']:<15} {label + ' ' + ranks_str(g['ranks']):<12} "
                  + " ".join(f"{g['split'][p]:>9.3f}" if p in g["split"] else f"{'':>9}" for p in phases)
                  + f" {busy:>6.3f} {g['cpu']:>6.3f} {bub} {r['step_s']:>6.2f}")
    print("bnd rows / bnd grads: boundary exchanges, including the wait for the other rank set (colocated: the "
          "gradient exchange runs inside V bwd)")


def _print_profile(rows, a):
    """The profiled extra step's time buckets, where one was taken."""
    if any(r["profile"][0] for r in rows):
        print()
        print("profile of one extra step (torch.profiler self CPU time, seconds, rank mean; collectives include "
              "time blocked waiting for peers):")
        for r in rows:
            b = defaultdict(float)
            for prof in r["profile"]:
                for k, v in prof["buckets"].items():
                    b[k] += v / a['world']
            top = ", ".join(f"{k} {v:.2f}" for k, v in r["profile"][0]["top"][:4])
            print(f"{r['name']:<15} " + "  ".join(f"{k} {v:.2f}" for k, v in sorted(b.items()))
                  + f"   | rank 0 top: {top}")


def _print_paired(paired, a):
    """The interleaved rows: per-round speed-ups and the plugin's overhead."""
    if paired:
        print()
        n = len(next(iter(paired.values())))
        print(f"interleaved: every row's engine in ONE set of 4 processes, round-robin steps ({n} rounds after "
              f"{a['warmup']} warm-up), per step the slowest rank; ratios are per round, then the median")
        ref = paired.get(BASELINE)
        print(f"{'row':<15} {'layout':<26} {'mb':>2} {'median s':>8} {'min s':>6} {'speedup vs homog.':>17} "
              f"{'(by min)':>8}")
        for name, ts in paired.items():
            sp = (f"{statistics.median(r / t for r, t in zip(ref, ts)):>16.2f}x {min(ref) / min(ts):>7.2f}x"
                  if ref else f"{'-':>17} {'-':>8}")
            print(f"{name:<15} {layout_str(LAYOUTS[name], a['world']):<26} {mb_of(name, a):>2} {statistics.median(ts):>8.3f} "
                  f"{min(ts):>6.3f} {sp}")
        print("(by min): ratio of the fastest steps; contention from other jobs only adds time, so on a shared "
              "machine the minimum is the steadier estimate")
        if "ds_hetero dp4" in paired and "plain DS dp4" in paired:
            h, p = paired["ds_hetero dp4"], paired["plain DS dp4"]
            ratios = [x / y for x, y in zip(h, p)]
            print(f"plugin overhead: ds_hetero dp4 / plain DeepSpeed dp4 step time, median of per-round ratios "
                  f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}), "
                  f"of fastest steps {min(h) / min(p):.3f}; median {statistics.median(h):.3f} s vs "
                  f"{statistics.median(p):.3f} s; target <= 1.05")
