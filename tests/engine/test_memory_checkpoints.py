"""Checkpoints and save_pretrained with per-stage ZeRO stages and frozen stages.

- vision ZeRO 3 + language ZeRO 1 (tower frozen): a checkpoint saved after 2 steps and loaded
  into a fresh engine of the same layout continues with the losses of the uninterrupted run;
  the manifest records each stage's ZeRO stage; loading it into another layout is refused
  naming the ZeRO-3 stage.
- vision frozen (no optimizer) + language ZeRO 1: a checkpoint moves to another layout (vision
  tp2 dp2, language tp1 dp4) and continues with the losses of the uninterrupted run.
- save_pretrained of the ZeRO-3 vision stage gives the engine's full weights.
"""

import json
import os

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

A = {"vision": {"tp": 1, "dp": 4, "zero_stage": 3, "freeze": ["tower"]}, "language": {"tp": 2, "dp": 2}}
FROZEN_A = {"vision": {"tp": 1, "dp": 4, "freeze": True}, "language": {"tp": 2, "dp": 2}}
FROZEN_B = {"vision": {"tp": 2, "dp": 2, "freeze": True}, "language": {"tp": 1, "dp": 4}}


def _engine(layout, zero=1):
    import ds_hetero
    from tests.helpers.checkpoint_reference import config, make_optimizer
    from ds_hetero.testing.parity import build_model

    return ds_hetero.initialize(build_model("llava", seed=7), config(layout, zero), optimizer=make_optimizer)


def _suite(rank, world_size, tmp):
    import torch

    from ds_hetero.checkpoint.manifest import CheckpointError
    from ds_hetero.testing.parity import build_model, full_named_parameters, make_batches

    batches = make_batches("llava", build_model("llava", seed=7), 4, 8)
    out = {}
    for name, first, second in (("zero3 vision", A, A), ("frozen vision moved", FROZEN_A, FROZEN_B)):
        straight = _engine(first)
        losses = [straight.train_batch(b).loss for b in batches]
        straight.groups.destroy()
        saver = _engine(first)
        for b in batches[:2]:
            saver.train_batch(b)
        path = os.path.join(tmp, name.replace(" ", "_"))
        saver.save_checkpoint(path)
        if name == "zero3 vision":
            full = full_named_parameters(saver)
            saver.save_pretrained(os.path.join(tmp, "hf"))
            if rank == 0:
                from transformers import AutoModelForImageTextToText

                loaded = dict(AutoModelForImageTextToText.from_pretrained(os.path.join(tmp, "hf")).named_parameters())
                out["hf_equal"] = all(torch.equal(loaded[n], full[n]) for n in full)
                with open(os.path.join(path, "latest")) as f:
                    tag = f.read().strip()
                with open(os.path.join(path, tag, "manifest.json")) as f:
                    out["manifest_zero"] = {s: l["zero_stage"] for s, l in json.load(f)["stages"].items()}
        saver.groups.destroy()
        loader = _engine(second)
        loader.load_checkpoint(path)
        out[name] = (losses[2:], [loader.train_batch(b).loss for b in batches[2:]])
        loader.groups.destroy()
    other = _engine({**A, "vision": {**A["vision"], "tp": 2, "dp": 2}})
    try:
        other.load_checkpoint(os.path.join(tmp, "zero3_vision"))
        out["refused"] = None
    except CheckpointError as exc:
        out["refused"] = str(exc)
    other.groups.destroy()
    return out


def test_checkpoints_follow_per_stage_zero_and_frozen_stages(tmp_path):
    results = run_distributed(_suite, world_size=4, timeout=900, tmp=str(tmp_path))
    for r in results:
        for name in ("zero3 vision", "frozen vision moved"):
            want, got = r[name]
            assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, want)), (name, got, want)
        assert r["refused"] is not None and "stage vision: ZeRO stage 3" in r["refused"], r["refused"]
    assert results[0]["hf_equal"] is True
    assert results[0]["manifest_zero"] == {"vision": 3, "language": 1}
