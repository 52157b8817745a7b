"""One measured trial of the planner, run on every rank by the deepspeed launcher (trial_runner.launch_one
starts it as a module: `--module ds_hetero.trial_worker`). A client of `entry`: it builds the engine with
`initialize`, so it sits above entry (docs/internals.md, the layers), and trial_runner names it, never imports it.

    deepspeed --num_gpus 4 --module ds_hetero.trial_worker --model tiny-llava --config cfg.json \
        --seq-len 96 --image-tokens 64 --steps 3 --out result.json

Rank 0 writes {"step_s": median after the first step, "steps": [seconds of each step]}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics


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


def main(argv=None) -> int:
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
    from ds_hetero.trial_runner import timed_steps

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
    raise SystemExit(main())
