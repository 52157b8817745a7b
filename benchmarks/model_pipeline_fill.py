"""A timing model of the colocated encoders' order around a pipelined language stage (no processes).

    .venv/bin/python benchmarks/model_pipeline_fill.py

Runs every rank's program of one step exactly as schedule/pipeline.py orders it (DeepSpeed's 1F1B
commands, the encoders' work from schedule/fill_drain.py) on model clocks: a language forward
takes f = 1 and a backward b = 2 per micro-batch and pipeline stage, an encoder pass e_f forward
and 2 e_f backward per rank; an isend costs nothing, a receive waits for its send, an exchange
waits for every rank. Prints the step time of the phased order (every encoder forward before the
1F1B, every backward after it) over that of the fill-and-drain order, per pp, micro-batches
(one encoder pass each) and e_f. A model: it has no communication time and no load; the
measurement is benchmarks/bench_pipeline.py.
"""

from __future__ import annotations

import argparse
import sys

from deepspeed.runtime.pipe import schedule as ds

from ds_hetero.schedule.fill_drain import fill_drain_order, train_steps


def programs(pp: int, micro_batches: int, fill: bool) -> list[list[tuple]]:
    feeds = {"vision": [range(m, m + 1) for m in range(micro_batches)]}
    out = []
    for s in range(pp):
        order, steps = fill_drain_order(feeds, micro_batches, pp, s, fill), train_steps(micro_batches, pp, s)
        ops = []
        for t in range(order.steps + 1):
            ops += [("work", *w) for w in order.before.get(t, ())]
            if t < order.steps:
                ops += [("cmd", c) for c in steps[t]] + [("work", *w) for w in order.after.get(t, ())]
        out.append(ops)
    return out


def step_time(pp: int, micro_batches: int, fill: bool, ef: float, f: float = 1.0, b: float = 2.0) -> float:
    progs, clock, pos, sent = programs(pp, micro_batches, fill), [0.0] * pp, [0] * pp, {}
    while True:
        before = list(pos)
        for s in range(pp):
            while pos[s] < len(progs[s]):
                op = progs[s][pos[s]]
                if op[0] == "cmd":
                    c = op[1]
                    if isinstance(c, ds.SendActivation):
                        sent.setdefault(("act", s + 1), []).append(clock[s])
                    elif isinstance(c, ds.SendGrad):
                        sent.setdefault(("grad", s - 1), []).append(clock[s])
                    elif isinstance(c, (ds.RecvActivation, ds.RecvGrad)):
                        queue = sent.get(("act" if isinstance(c, ds.RecvActivation) else "grad", s), [])
                        if not queue:
                            break
                        clock[s] = max(clock[s], queue.pop(0))
                    elif isinstance(c, ds.ForwardPass):
                        clock[s] += f
                    elif isinstance(c, ds.BackwardPass):
                        clock[s] += b
                elif op[1] in ("rows", "grads"):
                    break  # an exchange: wait for every rank
                else:
                    clock[s] += ef if op[1] == "forward" else 2 * ef
                pos[s] += 1
        if pos != before:
            continue
        heads = [progs[s][pos[s]] if pos[s] < len(progs[s]) else None for s in range(pp)]
        if all(h is None for h in heads):
            return max(clock)
        if not all(h is not None and h[0] == "work" for h in heads):
            raise RuntimeError(f"deadlock at {heads}")
        clock, pos = [max(clock)] * pp, [p + 1 for p in pos]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pp", type=int, nargs="+", default=[2, 3, 4])
    p.add_argument("--mb", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--ef", type=float, nargs="+", default=[0.3, 0.6, 1.0], help="encoder pass forward / f")
    a = p.parse_args(argv)
    print("phased / fill-and-drain step time (model; > 1: the fill-and-drain order is faster)")
    print(f"{'pp':>3s} {'mb':>3s} " + " ".join(f"{'e_f=' + str(e):>9s}" for e in a.ef))
    for pp in a.pp:
        for mb in a.mb:
            ratios = [step_time(pp, mb, False, e) / step_time(pp, mb, True, e) for e in a.ef]
            print(f"{pp:3d} {mb:3d} " + " ".join(f"{r:9.3f}" for r in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
