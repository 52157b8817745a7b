"""One measured trial, run on every rank by the deepspeed launcher (planner/trials.py starts it).

A script the launcher runs by path, hence its absolute imports.

    deepspeed --num_gpus 4 ds_hetero/planner/trial_worker.py --model tiny-llava --config cfg.json \
        --seq-len 96 --image-tokens 64 --steps 3 --out result.json

The model: a built-in tiny model built with seed 0 (the recipes' model), a config.json built
with seeded random weights, or a checkpoint directory loaded as `initialize(..., weights=DIR)`
does. Rank 0 writes {"step_s": median after the first step, "steps": [seconds of each step]}.
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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    from ds_hetero.planner.trials import timed_steps

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
