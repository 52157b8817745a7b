"""Running the planner's measured trials: the runtime's side (the planner never imports the engine).

The planner chooses the candidates and ranks what was measured (planner/trials.py); these two
runners, which need the engine, are handed to it by the entry points:

    launch_one          `ds-hetero plan --trial K` (ds_hetero/cli.py hands it to planner/cli.py): one
                        candidate in its own launch of the `deepspeed` launcher on this machine
                        (`--num_gpus world`, CPU ranks with DS_ACCELERATOR=cpu) running this
                        module (`worker_main`): the model built as the recipes build it (a tiny
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

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

WORKER = "ds_hetero.trial_runner"  # run as a module (`python -m`): a script by path would put ds_hetero/ on sys.path


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


def build_model(source: str):
    """(model, weights directory or None)."""
    import torch

    if source == "tiny-llava":
        from ds_hetero.toy import tiny_llava

        return tiny_llava("clip", seed=0), None
    if source == "tiny-qwen2-vl":
        from ds_hetero.toy import tiny_qwen2_vl

        return tiny_qwen2_vl(seed=0), None
    if os.path.isdir(source):
        from ds_hetero.families.meta import meta_model

        return meta_model(source, dtype=torch.float32), source
    from transformers import AutoModelForImageTextToText

    from ds_hetero.planner.model_source import load_hf_config

    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_config(load_hf_config(source)), None


def worker_main(argv=None) -> int:
    """One measured trial on this rank (the launch `launch_one` starts; rank 0 writes the result)."""
    p = argparse.ArgumentParser(description="one measured trial of the planner, on every rank")
    p.add_argument("--model", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--image-tokens", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

    import torch.distributed as dist

    from ds_hetero.config import read_ds_config
    from ds_hetero.entry import initialize
    from ds_hetero.planner.trial_data import workload_samples

    model, weights = build_model(args.model)
    cfg = read_ds_config(args.config)
    samples = workload_samples(model.config, args.seq_len, args.image_tokens, int(cfg["train_batch_size"]))
    engine = initialize(model, cfg, weights=weights)
    steps = timed_steps(engine, samples, args.steps)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"step_s": statistics.median(steps[1:]), "steps": steps}, f)
    dist.barrier()
    return 0


if __name__ == "__main__":
    raise SystemExit(worker_main())
