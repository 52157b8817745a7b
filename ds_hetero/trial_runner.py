"""Running the planner's measured trials: the runtime's side (the planner never imports the engine).

The planner chooses the candidates and ranks what was measured (planner/trials.py); these two
runners, which need the engine, are handed to it by the entry points:

    launch_one          `ds-hetero plan --trial K` (ds_hetero/cli.py hands it to planner/cli.py): one
                        candidate in its own launch of the `deepspeed` launcher on this machine
                        (`--num_gpus world`, CPU ranks with DS_ACCELERATOR=cpu) running
                        trial_worker.py (a client of entry): the model built as the recipes build it (a tiny
                        model with seed 0, a config.json with seeded random weights, a checkpoint
                        directory loaded as `initialize(..., weights=DIR)` does), samples of the
                        planned sequence length and image tokens (planner/trial_data.py),
                        `initialize` with the candidate's config, `steps` optimizer steps; rank 0
                        writes {"step_s": median after the first step, "steps": [each step's s]}.
    trials_in_process   `"hetero_parallel": {"auto": true, "trial": K}` (entry.py hands it to
                        planner/auto.py): every rank builds each candidate's HeteroEngine on a deep
                        copy of the model (the user's model is never stepped), runs the steps on
                        the same samples, and the engine's process groups are destroyed before the
                        next. Every rank takes part in every trial in the same order and the step
                        times are max-reduced over the world. They need a model with its weights
                        (not a meta model loaded with `weights=`) and the optimizer from the config;
                        they hold a second copy of the model while they run.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

WORKER = "ds_hetero.trial_worker"  # run as a module (`python -m`): a script by path would put ds_hetero/ on sys.path


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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [_launcher(), "--num_gpus", str(world), "--master_port", _port(), "--module", WORKER, "--model", model,
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

    from .config import parse_config
    from .engine import HeteroEngine
    from .validation import check_all

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
