"""What one device can check: the engine at world size 1 (vision tp1 dp1 + language tp1 dp1).

    .venv/bin/python recipes/check_one_device.py              # on the accelerator DeepSpeed picks (CUDA on a GPU)
    DS_ACCELERATOR=cpu .venv/bin/python recipes/check_one_device.py --steps 2   # the same on CPU (a test runs it)

1. fp32 parity: HeteroEngine (colocated, ZeRO 1, AdamW, clipping active) against the single-process
   Hugging Face model (on the CPU) on the same seeded weights and batches: losses against the
   reference and against the model's own `model(**batch).loss`, grad norms, every updated weight;
2. bf16 (ZeRO 1) over the same batches: losses within 1% of fp32, finite;
3. the stage models' step times: per stage and phase, mean over the steps after the first
   (StepResult.stage_time; `--synchronize` waits for the device at every span, so the times are
   the work's, not its launch's).

Catches device mismatches (a tensor left on the CPU), CUDA-only errors and dtype slips. Prints the
figures; exit code 1 when a check fails. Device-vs-CPU fp32 agreement is held to 1e-4 relative
on a GPU (other kernels, other reduction orders; TF32 must be off: NVIDIA_TF32_OVERRIDE=0) and
to the parity tests' 1e-5 on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's ds_hetero (ds_hetero.testing.parity: the parity tests' reference)

LAYOUT = {"vision": {"dp": 1}, "language": {"dp": 1}}


def _init_world_of_one(store: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
    backend = "nccl" if torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1,
                            timeout=timedelta(seconds=300))


def _bf16_run(batches, steps, clip, synchronize):
    import ds_hetero
    from ds_hetero.testing.parity import build_model

    config = {
        "train_batch_size": 4, "zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.99], "eps": 1e-4,
                                                  "weight_decay": 0.01, "torch_adam": True}},
        "zero_allow_untested_optimizer": True, "gradient_clipping": clip, "steps_per_print": 10**6,
        "hetero_parallel": {"micro_batches": 2, "stages": LAYOUT},
    }
    engine = ds_hetero.initialize(build_model("llava", seed=7), config)
    engine.timeline.synchronize = synchronize
    results = [engine.train_batch(b) for b in batches[:steps]]
    engine.groups.destroy()
    return results


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--synchronize", action="store_true", help="exact per-phase times (waits for the device)")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)

    from ds_hetero.testing.parity import build_model, make_batches, train_both

    clip = 0.3
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        _init_world_of_one(os.path.join(tmp, "store"))
        try:
            fp32 = train_both(0, 1, "llava", LAYOUT, zero_stage=1, steps=args.steps, clip=clip, batch_size=4)
            batches = make_batches("llava", build_model("llava", seed=7), args.steps, 4)
            bf16 = _bf16_run(batches, args.steps, clip, args.synchronize)
        finally:
            torch.distributed.destroy_process_group()

    on_gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu"
    rtol = 1e-4 if on_gpu else 1e-5

    def close(a, b, tol):
        return abs(a - b) <= tol * abs(b)

    for got, ref, hf in zip(fp32["losses"], fp32["ref_losses"], fp32["hf_losses"]):
        if not (close(got, ref, rtol) and close(ref, hf, 1e-5)):
            failures.append(f"fp32 loss {got} vs reference {ref} vs HF model's own {hf}")
    for got, ref in zip(fp32["norms"], fp32["ref_norms"]):
        if not close(got, ref, 10 * rtol):
            failures.append(f"fp32 grad norm {got} vs reference {ref}")
    err, where, abs_err, compared = fp32["weight_err"]
    if compared == 0 or err > 10 * rtol:
        failures.append(f"weights: largest relative error {err:.2e} at {where} over {compared} tensors")
    bf16_losses = [r.loss for r in bf16]
    gaps = [abs(a - b) / a for a, b in zip(fp32["losses"], bf16_losses)]
    if max(gaps) > 0.01 or any(r.skipped for r in bf16):
        failures.append(f"bf16 losses {bf16_losses} vs fp32 {fp32['losses']}")

    tail = bf16[1:] or bf16
    stage_time: dict[str, dict[str, float]] = {}
    for r in tail:
        for stage, phases in r.stage_time.items():
            for phase, sec in phases.items():
                stage_time.setdefault(stage, {}).setdefault(phase, 0.0)
                stage_time[stage][phase] += sec / len(tail)
    figures = {
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "fp32_losses": fp32["losses"], "reference_losses": fp32["ref_losses"], "hf_losses": fp32["hf_losses"],
        "weight_rel_err": err, "weights_compared": compared,
        "bf16_losses": bf16_losses, "bf16_max_rel_gap": max(gaps),
        "bf16_step_time_s": sum(r.step_time for r in tail) / len(tail),
        "bf16_stage_time_s": stage_time,
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    for line in failures:
        print("FAILED:", line)
    print("one-device check:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
