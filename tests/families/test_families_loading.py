"""Qwen2.5-VL, Gemma 3, Qwen3-VL, InternVL, LLaVA-OneVision and Qwen3.5: per-shard loading and save_pretrained.

A model built on the meta device and filled per stage and tp shard from a safetensors checkpoint
(`initialize(meta_model(DIR), cfg, weights=DIR)`) trains exactly like the same model fully built
(vision tp2 dp2 + language tp2 dp2: every family's tower, projector / mergers and decoder
sharded), each tp rank reading half of every sharded tensor; then
`engine.save_pretrained` writes a checkpoint that `from_pretrained` reads back to the trained
weights.
"""

import pytest

from ds_hetero.testing.launch import run_distributed
from ds_hetero.testing.parity import full_named_parameters
from tests.helpers.family_parity import FAMILIES, build_model, make_batches

pytestmark = pytest.mark.distributed

LAYOUT = {"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}}
CONFIG = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "gradient_clipping": 0.3,
          "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
          "hetero_parallel": {"micro_batches": 2, "stages": LAYOUT}}


def _optimizer(params):
    import torch

    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)


def _suite(rank, world_size, checkpoints, out_dirs):
    import torch
    import torch.distributed as dist

    import ds_hetero

    results = {}
    for family, checkpoint in checkpoints.items():
        batches = make_batches(family, build_model(family, seed=7), 2, 8)
        built = ds_hetero.initialize(build_model(family, seed=7), CONFIG, optimizer=_optimizer)
        want = [built.train_batch(s).loss for s in batches]
        want_weights = full_named_parameters(built)
        built.groups.destroy()

        loaded = ds_hetero.initialize(ds_hetero.meta_model(checkpoint), CONFIG, optimizer=_optimizer,
                                      weights=checkpoint)
        report = {stage: (load.sharded_bytes_read, load.sharded_bytes_full) for stage, load in
                  loaded.load_report.items()}
        got = [loaded.train_batch(s).loss for s in batches]
        got_weights = full_named_parameters(loaded)
        loaded.save_pretrained(out_dirs[family])
        loaded.groups.destroy()
        dist.barrier()
        saved_diff = None
        if rank == 0:
            from transformers import AutoModelForImageTextToText

            back = AutoModelForImageTextToText.from_pretrained(out_dirs[family], dtype=torch.float32)
            params = dict(back.named_parameters())
            saved_diff = max((params[n].detach() - w).abs().max().item() for n, w in got_weights.items())
        results[family] = dict(
            want=want, got=got, report=report, saved_diff=saved_diff, compared=len(want_weights),
            weight_diff=max((got_weights[n] - w).abs().max().item() for n, w in want_weights.items()))
    return results


def test_families_load_per_shard_and_save_pretrained(tmp_path):
    checkpoints, out_dirs = {}, {}
    for family in FAMILIES:
        checkpoints[family] = str(tmp_path / family)
        build_model(family, seed=7).save_pretrained(checkpoints[family], max_shard_size="200KB")
        out_dirs[family] = str(tmp_path / f"{family}_saved")
    results = run_distributed(_suite, world_size=4, timeout=900, checkpoints=checkpoints, out_dirs=out_dirs)
    for rank, per_rank in enumerate(results):
        for family, r in per_rank.items():
            for got, want in zip(r["got"], r["want"]):
                assert abs(got - want) <= 1e-6 * abs(want), (rank, family, r["got"], r["want"])
            assert r["compared"] > 0 and r["weight_diff"] <= 1e-6, (rank, family, r["weight_diff"])
            for stage, (read, full) in r["report"].items():  # tp2: half of every sharded tensor
                assert full > 0 and 2 * read == full, (rank, family, stage, read, full)
            if rank == 0:
                assert r["saved_diff"] is not None and r["saved_diff"] <= 1e-7, (family, r["saved_diff"])
