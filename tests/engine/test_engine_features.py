"""HeteroEngine beyond parity: the data loader, checkpoints, bf16, errors on every rank, the main job.

One 4-rank launch runs all checks in sequence (each launch costs seconds on this box).
"""

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed


def _config(zero=1, bf16=False, **stages):
    cfg = {
        "train_batch_size": 8,
        "zero_optimization": {"stage": zero},
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "torch_adam": True}},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**6,
        "hetero_parallel": {"micro_batches": 2, "stages": stages or {
            "vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}},
    }
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def _engine(config, seed=5, data_seed=0, size=64):
    import ds_hetero
    from ds_hetero.toy import ShapesCaptionDataset
    from ds_hetero.toy import tiny_llava

    model = tiny_llava("clip", seed=seed)
    data = ShapesCaptionDataset.for_llava(model.config, size=size, seed=data_seed)
    return ds_hetero.initialize(model, config, training_data=data), data


def _raises_everywhere(fn, exc_type, words):
    try:
        fn()
    except exc_type as exc:
        assert words in str(exc), str(exc)
        return str(exc)
    raise AssertionError(f"expected {exc_type.__name__} containing {words!r}")


def _recipe_run(rank, tmp):
    """recipes/train_llava.py for 4 steps on a tiny checkpoint saved here: its summary and what it printed (rank 0)."""
    import contextlib
    from tests.helpers.driver_report import load_recipe
    import io
    import json
    import os

    import torch.distributed as dist

    from ds_hetero.toy import tiny_llava

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    recipe = load_recipe(root, "train_llava")
    summary_path = os.path.join(tmp, f"summary{rank}.json")
    # --model: a safetensors checkpoint (saved here from a tiny model, offline), loaded per stage and tp shard
    # into a model built on the meta device
    checkpoint = os.path.join(tmp, "hf_model")
    if rank == 0:
        tiny_llava("clip", seed=11).save_pretrained(checkpoint)
    dist.barrier()
    printed = io.StringIO()  # not a terminal, as a log file: the progress comes as plain lines
    with contextlib.redirect_stdout(printed):
        recipe.main(["--steps", "4", "--samples", "256", "--summary-json", summary_path, "--model", checkpoint,
                     "--trace", os.path.join(tmp, "trace.json"),
                     "--deepspeed_config", os.path.join(root, "ds_configs", "llava_colocated.json")])
    if rank == 0:
        with open(summary_path) as f, open(os.path.join(tmp, "trace.json")) as t:
            counters = [e for e in json.load(t)["traceEvents"] if e["ph"] == "C"]
            return {"recipe": json.load(f), "recipe_stdout": printed.getvalue(), "trace_counters": counters}
    return {}


def _suite(rank, world_size, tmp):
    import torch
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.toy import tiny_llava

    out = {}

    # 1. loader: every rank reads its share; the loss falls on the synthetic task
    engine, data = _engine(_config())
    losses = [engine.train_batch().loss for _ in range(6)]
    out["loader_losses"] = losses
    out["needed"] = sorted(engine.data_path.needed_positions())

    # 2. a bad sample from the loader makes every rank raise (only some ranks read it)
    bad_index = engine.loader.indices(engine.global_steps)[0]
    original = data.__class__.__getitem__

    def broken(self, i):
        sample = original(self, i)
        if i == bad_index:
            sample = dict(sample, input_ids=sample["input_ids"][5:], labels=sample["labels"][5:])
        return sample

    data.__class__.__getitem__ = broken
    try:
        # ranks that read the sample name it; the others learn of it through the consensus
        out["bad_sample_error"] = _raises_everywhere(engine.train_batch, ValueError, "train_batch: ")
    finally:
        data.__class__.__getitem__ = original
    dist.barrier()
    engine.groups.destroy()

    # 3. checkpoint: save after 2 steps, resume in a fresh engine: the same next losses
    engine, _ = _engine(_config(zero=2))
    for _ in range(2):
        engine.train_batch()
    engine.save_checkpoint(tmp)
    continued = [engine.train_batch().loss for _ in range(2)]
    engine.groups.destroy()
    engine, _ = _engine(_config(zero=2), seed=99)  # different initial weights: the checkpoint must win
    engine.load_checkpoint(tmp)
    resumed = [engine.train_batch().loss for _ in range(2)]
    out["checkpoint"] = (continued, resumed)
    engine.groups.destroy()

    # 4. bf16 against fp32: the same 20 steps
    curves = {}
    for bf16 in (False, True):
        engine, _ = _engine(_config(bf16=bf16))
        curves[bf16] = [engine.train_batch().loss for _ in range(20)]
        engine.groups.destroy()
    out["bf16"] = curves

    # 5. errors every rank raises before any collective
    model = tiny_llava("clip")
    no_opt = _config()
    del no_opt["optimizer"]
    out["errors"] = [
        _raises_everywhere(lambda: ds_hetero.initialize(model, no_opt), HeteroConfigError, "optimizer"),
        _raises_everywhere(lambda: ds_hetero.initialize(model, _config(
            vision={"dp": 4}, language={"tp": 4, "dp": 1})), HeteroConfigError, "key/value heads"),
        _raises_everywhere(lambda: ds_hetero.initialize(model, _config(
            vision={"dp": 4}, language={"tp": 3, "dp": 1})), HeteroConfigError, "product is 4"),
        _raises_everywhere(lambda: ds_hetero.initialize(model, _config(zero=0, bf16=True)),
                           HeteroConfigError, "BF16_Optimizer"),
    ]

    # 6. the main job's script, a few steps (the README's first command runs it under `deepspeed`)
    out.update(_recipe_run(rank, tmp))
    torch.manual_seed(0)
    return out


def test_loader_checkpoint_bf16_and_errors(tmp_path):
    results = run_distributed(_suite, world_size=4, timeout=600, tmp=str(tmp_path / "ckpt"))
    r0 = results[0]
    # every rank saw the same global losses
    assert all(r["loader_losses"] == r0["loader_losses"] for r in results)
    losses = r0["loader_losses"]
    assert losses[-1] < losses[0] - 0.5, losses
    # each rank reads in full only its shares: vision dp r takes sample r of each 4-sample micro-batch,
    # language dp r//2 takes samples 2(r//2), 2(r//2)+1; e.g. rank 0: {0, 4} | {0, 1, 4, 5}
    assert [r["needed"] for r in results] == [[0, 1, 4, 5], [0, 1, 4, 5], [2, 3, 6, 7], [2, 3, 6, 7]]
    errors = [r["bad_sample_error"] for r in results]
    assert sum("image placeholder tokens" in e for e in errors) >= 1, errors
    assert all("image placeholder tokens" in e or "found an invalid sample" in e for e in errors), errors
    continued, resumed = r0["checkpoint"]
    assert resumed == pytest.approx(continued, rel=1e-6), (continued, resumed)
    fp32, bf16 = r0["bf16"][False], r0["bf16"][True]
    gaps = [abs(a - b) / a for a, b in zip(fp32, bf16)]
    assert max(gaps) < BF16_TOLERANCE, (fp32, bf16, gaps)
    assert bf16[-1] < bf16[0] - 1.0
    for r in results:
        assert len(r["errors"]) == 4
    summary = r0["recipe"]
    assert summary["steps"] == 4 and summary["final_loss"] < summary["first_loss"]
    assert summary["boundary_forward_bytes_per_step"] == summary["boundary_forward_lower_bound_per_step"] > 0
    assert len(summary["peak_memory_mb_per_rank"]) == 4
    assert summary["last_loss"] == summary["losses"][-1] and summary["final_loss"] == pytest.approx(
        sum(summary["losses"]) / 4)  # the mean of the last 10 steps: here all 4
    # what rank 0 printed under a log file: the layout line, a line per step (4 steps), the labeled summary
    printed = r0["recipe_stdout"]
    assert "\r" not in printed
    assert "layout: colocated | vision tp1 cp1 dp4 pp1 ep1 ZeRO 1" in printed and "| data synthetic, 256 samples" in printed
    assert [line.split()[1] for line in printed.splitlines() if line.startswith("step ")] == ["1/4", "2/4", "3/4", "4/4"]
    for label in ("loss, first step", "loss, last step", "loss, mean of last 10 steps", "tokens/s", "step time",
                  "data wait per step", "boundary bytes", "backward", "peak memory", "MB per rank", "bubble",
                  "% per rank", "per-step losses and grad norms", "TFLOP/s per device", "whole model",
                  "language only", "MFU"):
        assert label in printed, (label, printed)
    # TFLOP/s and MFU (docs/throughput.md): the model scope holds the language scope; every step's line has it
    assert summary["tflops_per_device_model"] > summary["tflops_per_device_language"] > 0
    assert 0 < summary["mfu_model"] < 1 and set(summary["tflops_per_device_per_stage"]) == {"vision", "language"}
    assert all("TFLOP/s per device (MFU" in line for line in printed.splitlines() if line.startswith("step "))
    # and in the Chrome trace: a counter track per rank, a point per step
    counters = r0["trace_counters"]
    assert sorted({e["tid"] for e in counters}) == [0, 1, 2, 3] and len(counters) == 16, counters
    assert all(e["args"]["tflops_per_device/model"] > 0 and 0 < e["args"]["mfu/model"] < 1 for e in counters)
    assert str(summary["losses"][1]) not in printed  # the per-step lists: --summary-json only
    print("bf16 vs fp32 loss:", list(zip(fp32, bf16)), "max relative gap", max(gaps))


BF16_TOLERANCE = 0.01  # relative gap of the bf16 loss to the fp32 loss at every one of 20 steps (seen: 0.1%)
