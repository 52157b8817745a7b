"""Qwen2.5-Omni thinker: save_pretrained, per-shard loading and eval_batch, in one 4-rank launch.

1. colocated (vision dp4, audio tp2 dp2, language tp2 dp2): one training step, then
   save_pretrained; the directory loads with the thinker's own `from_pretrained` and its logits
   equal those of the engine's gathered weights (and differ from the untrained model's).
2. the same directory read per stage and per tp shard into a meta-device thinker
   (`initialize(meta_model(DIR), ..., weights=DIR)`) in placement "mixed" (vision dp2 on the
   language ranks [0, 1], language tp2, audio tp2 on [2, 3]): eval_batch equals the loaded
   thinker's own loss, on samples with an image only, audio only, both, and neither.
3. the colocated run's engine checkpoint (save_checkpoint) loads into the mixed layout
   (load_checkpoint reshards it): after another training step moved the weights, the loss is
   the saved weights' again.
"""

import copy

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

COLOCATED = {"vision": {"dp": 4}, "audio": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}}
MIXED = {"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"tp": 2, "dp": 1, "ranks": [2, 3]},
         "language": {"tp": 2, "dp": 1, "ranks": [0, 1]}}


def _config(placement, stages):
    return {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
            "gradient_clipping": 1.0, "steps_per_print": 10**6,
            "hetero_parallel": {"placement": placement, "micro_batches": 2, "stages": stages}}


def _suite(rank, world_size, tmp):
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForImageTextToText

    import ds_hetero
    from ds_hetero.families import adapter_for
    from ds_hetero.testing.parity import build_model, full_named_parameters, make_batches
    from ds_hetero.testing.omni_samples import hf_inputs

    model = build_model("omni", seed=3)
    untrained = copy.deepcopy(model).eval()
    train, held_out = make_batches("omni", model, 2, 8, seed=40)
    engine = ds_hetero.initialize(model, _config("colocated", COLOCATED))
    engine.train_batch(train)
    engine.save_pretrained(tmp)
    engine.save_checkpoint(tmp + "-ckpt")
    got = full_named_parameters(engine)
    parts = [None] * world_size
    dist.all_gather_object(parts, got)
    engine.groups.destroy()
    out = {}
    adapter = adapter_for(untrained)
    loaded = AutoModelForImageTextToText.from_pretrained(tmp, dtype=torch.float32).eval()
    kw = hf_inputs(untrained, adapter, held_out)
    if rank == 0:
        trained = copy.deepcopy(untrained)
        full = {k: v for p in parts for k, v in p.items()}
        missing, unexpected = trained.load_state_dict(full, strict=False)
        assert not unexpected and all("rotary" in k or "position" in k for k in missing), missing
        with torch.no_grad():
            ref, new, old = (m(**kw).logits for m in (trained, loaded, untrained))
        out["logits_diff"] = (new - ref).abs().max().item()
        out["control_diff"] = (old - new).abs().max().item()
    dist.barrier()

    with torch.no_grad():
        want = float(loaded(**kw).loss)
    meta = ds_hetero.meta_model(tmp, dtype=torch.float32)
    engine = ds_hetero.initialize(meta, _config("mixed", MIXED), weights=tmp)
    out["eval"] = (engine.eval_batch(held_out), want)
    out["held"] = sorted(engine.engines)
    engine.train_batch(train)  # moves the weights away from the saved ones ...
    out["moved"] = engine.eval_batch(held_out)
    engine.load_checkpoint(tmp + "-ckpt")  # ... and the colocated checkpoint, resharded, brings them back
    out["restored"] = (engine.eval_batch(held_out), engine.global_steps)
    engine.groups.destroy()
    return out


def test_omni_save_pretrained_loads_per_shard_and_evaluates_in_mixed_placement(tmp_path):
    results = run_distributed(_suite, world_size=4, timeout=600, tmp=str(tmp_path / "omni"))
    assert results[0]["logits_diff"] <= 1e-5 and results[0]["control_diff"] > 1e-3, results[0]
    for rank, r in enumerate(results):
        got, want = r["eval"]
        assert got == pytest.approx(want, rel=1e-5, abs=0), (rank, r)
    assert [r["held"] for r in results] == [["language", "vision"]] * 2 + [["audio"]] * 2
    for r in results:  # engine checkpoint of the colocated run, loaded into the mixed layout
        want = r["eval"][1]
        assert abs(r["moved"] - want) > 1e-4 * abs(want), r
        assert r["restored"][0] == pytest.approx(want, rel=1e-5, abs=0) and r["restored"][1] == 1, r
