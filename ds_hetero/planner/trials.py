"""Measured trials: run the top K runnable candidates for a few steps and re-rank them by step time.

Like DeepSpeed's autotuner, the cost model proposes and a short measurement decides. Two ways,
one per entry point:

`ds-hetero plan --trial K` (`launch_trials`): each candidate is one launch of the `deepspeed`
launcher on this machine (`--num_gpus world_size`, CPU ranks with DS_ACCELERATOR=cpu) running
`trial_worker.py`: the model built as the trial worker builds it, samples of the planned
sequence length and image tokens (trial_data.py), `initialize` with the candidate's config,
`steps` optimizer steps; the worker reports the median step time after the first (the slowest
rank's, each step). Separate launches isolate the candidates (a crash or an out-of-memory
fails one trial, which is then ranked last, not the plan) and every launch starts from the same
state. With `rounds` > 1 the candidates run round-robin (A B A B ...), so drift on a shared
machine hits them alike; the median over rounds ranks them.

`"hetero_parallel": {"auto": true, "trial": K}` (`trials_in_process`): the processes already
exist (the user's launcher), so the trials run inside them: rank 0 plans and broadcasts the K
configs, then every rank builds each candidate's HeteroEngine on a deep copy of the model (the
user's model is never stepped), runs the steps on the same workload samples, and the engines'
process groups are destroyed before the next. Every rank takes part in every trial in the same
order, and the step times are max-reduced over the world, so every rank ranks the trials
identically with no further broadcast. In-process trials need a model with its weights (not a
meta model loaded with `weights=`) and the optimizer from the config; they hold a second copy
of the model while they run.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .cost import Prediction

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trial_worker.py")


@dataclass(frozen=True)
class Trial:
    prediction: Prediction
    measured_s: float  # median step time; inf when the trial failed
    rounds: tuple[float, ...] = ()
    error: str = ""


def top_runnable(plan, k: int) -> list[Prediction]:
    """The K best fitting runnable candidates (the planner's order)."""
    return [p for p in plan.runnable if p.fits][:k]


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _launcher() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    return here if os.path.exists(here) else "deepspeed"


def launch_one(model: str, cfg: Mapping[str, Any], world: int, seq_len: int, image_tokens: int, steps: int,
               workdir: str, tag: str, timeout_s: float = 1800) -> tuple[float, str]:
    """(measured median step seconds, error text or "") of one candidate, in its own launch."""
    cfg_path, out_path = os.path.join(workdir, f"{tag}.json"), os.path.join(workdir, f"{tag}.result.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [_launcher(), "--num_gpus", str(world), "--master_port", _port(), WORKER, "--model", model,
           "--config", cfg_path, "--seq-len", str(seq_len), "--image-tokens", str(image_tokens),
           "--steps", str(steps), "--out", out_path]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return float("inf"), f"timed out after {timeout_s:.0f} s"
    if proc.returncode != 0 or not os.path.exists(out_path):
        tail = (proc.stdout[-1500:] + proc.stderr[-2500:]).strip()
        return float("inf"), f"launch failed (exit {proc.returncode}): {tail}"
    with open(out_path) as f:
        return float(json.load(f)["step_s"]), ""


def launch_trials(model: str, plan, k: int, world: int, steps: int = 3, rounds: int = 1,
                  log: Callable[[str], None] = print) -> list[Trial]:
    """Run the top K runnable candidates of `plan` with the deepspeed launcher; best measured first."""
    if steps < 2:
        raise ValueError("--trial-steps must be at least 2 (the first step is not timed)")
    preds = top_runnable(plan, k)
    if not preds:
        raise ValueError("no fitting runnable candidate to try")
    wl = plan.workload
    times: dict[int, list[float]] = {i: [] for i in range(len(preds))}
    errors: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="ds_hetero_trial_") as workdir:
        for r in range(rounds):
            for i, p in enumerate(preds):
                if i in errors:
                    continue
                t0 = time.perf_counter()
                step, err = launch_one(model, plan.ds_config(p), world, wl.seq_len, wl.image_tokens, steps, workdir,
                                       f"trial{i}_{r}")
                log(f"trial {i + 1}/{len(preds)} round {r + 1}: {p.candidate.label()}: "
                    + (f"{step:.4f} s/step" if not err else f"FAILED ({err.splitlines()[-1] if err else ''})")
                    + f" [{time.perf_counter() - t0:.0f} s]")
                if err:
                    errors[i] = err
                else:
                    times[i].append(step)
    trials = [Trial(p, statistics.median(times[i]) if times[i] and i not in errors else float("inf"),
                    tuple(times[i]), errors.get(i, "")) for i, p in enumerate(preds)]
    return sorted(trials, key=lambda t: t.measured_s)


def trial_table(trials: Sequence[Trial]) -> str:
    pred_order = sorted(trials, key=lambda t: t.prediction.step_s)
    lines = ["measured trials (re-ranked by measured step time; the first is the pick):",
             f"{'#':>3} {'layout':<46} {'predicted':>10} {'measured':>10} {'pred #':>6}"]
    for i, t in enumerate(trials, 1):
        m = f"{t.measured_s:.4f} s" if t.measured_s != float("inf") else "failed"
        lines.append(f"{i:>3} {t.prediction.candidate.label():<46} {t.prediction.step_s:>9.4f}s {m:>10} "
                     f"{pred_order.index(t) + 1:>6}")
    return "\n".join(lines)


def timed_steps(engine, samples: Sequence[dict], steps: int) -> list[float]:
    """Seconds of each step, the slowest rank's (one max all-reduce after the steps, on the world)."""
    import torch
    import torch.distributed as dist

    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.train_batch(samples)
        out.append(time.perf_counter() - t0)
    t = torch.tensor(out, dtype=torch.float64, device=engine.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def trials_in_process(model, configs: Sequence[Mapping[str, Any]], samples: Sequence[dict], steps: int,
                      seed: int = 0) -> list[float]:
    """Median step seconds of each config (after the first step), run on every rank in the same order."""
    import copy
    import gc

    import torch.distributed as dist

    from ..config import parse_config
    from ..engine import HeteroEngine
    from ..validation import check_all

    world = dist.get_world_size()
    out = []
    for cfg in configs:
        parsed = parse_config(cfg, world)
        check_all(parsed, model)
        engine = HeteroEngine(copy.deepcopy(model), parsed, seed=seed)
        try:
            out.append(statistics.median(timed_steps(engine, samples, steps)[1:]))
        finally:
            engine.groups.destroy()
            del engine
            gc.collect()
    return out
