"""HeteroEngine.eval_batch and save_pretrained against single-process Hugging Face models.

One 4-rank launch, four engines: LLaVA colocated (vision tp1dp4 / language tp2dp2, ZeRO-1),
LLaVA disaggregated (vision dp2 on ranks 0-1 / language tp2 on ranks 2-3), LLaVA colocated
under ZeRO-3 (partitioned parameters), Qwen2-VL colocated (vision tp2dp2 / language tp2dp2).
Each: eval_batch on a full global batch and on a partial one equals the untrained model's own
`model(**batch).loss`; after one training step, save_pretrained -> from_pretrained gives the
logits of the trained weights (gathered independently by ds_hetero.testing.parity) within 1e-6.
Negative controls: the untrained model's logits differ; one label changed moves both
engine.eval_batch's loss and the reference's, to the same value.
"""

import copy

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

CASES = {
    "llava colocated": dict(family="llava", placement="colocated", zero=1,
                            stages={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}),
    "llava disaggregated": dict(family="llava", placement="disaggregated", zero=1,
                                stages={"vision": {"tp": 1, "dp": 2, "ranks": [0, 1]},
                                        "language": {"tp": 2, "dp": 1, "ranks": [2, 3]}}),
    "llava colocated zero3": dict(family="llava", placement="colocated", zero=3,
                                  stages={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}),
    "llava language tp2 cp2 sp (sequence shards)": dict(
        family="llava", placement="colocated", zero=1,
        stages={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}}),
    "qwen2-vl colocated": dict(family="qwen2_vl", placement="colocated", zero=2,
                               stages={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}}),
}


def _case(rank, tmp, name, family, placement, zero, stages):
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForImageTextToText

    import ds_hetero
    from ds_hetero.testing.parity import build_model, full_named_parameters, hf_inputs, make_batches

    config = {
        "train_batch_size": 8, "zero_optimization": {"stage": zero}, "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "gradient_clipping": 1.0, "steps_per_print": 10**6,
        "hetero_parallel": {"placement": placement, "micro_batches": 2, "stages": stages},
    }
    model = build_model(family, seed=3)
    untrained = copy.deepcopy(model).eval()
    train, held_out = make_batches(family, model, 2, 8, seed=40)
    engine = ds_hetero.initialize(model, config)
    out = {}

    # eval_batch == model(**batch).loss, for a full global batch and a partial one (padded inside)
    with torch.no_grad():
        for part in (held_out, held_out[:5]):
            want = float(untrained(**hf_inputs(family, untrained, part)).loss)
            out.setdefault("eval", []).append((engine.eval_batch(part), want))
        changed = [dict(s) for s in held_out]
        lab = changed[0]["labels"].clone()
        k = int((lab != -100).nonzero()[1])
        lab[k] = (lab[k] + 1) % 50
        changed[0]["labels"] = lab
        # negative control through the engine: one changed label moves eval_batch's loss too, and
        # to where the reference's moves (not only the reference's own loss)
        want_changed = float(untrained(**hf_inputs(family, untrained, changed)).loss)
        out["eval_control"] = (engine.eval_batch(changed), want_changed)
        bad = [dict(s) for s in held_out]
        bad[3]["labels"] = bad[3]["labels"][:-1]  # shape differs from input_ids: refused before any collective
        try:
            engine.eval_batch(bad)
        except ValueError as exc:
            out["bad_sample"] = str(exc)

    engine.train_batch(train)
    save_dir = f"{tmp}/{name.replace(' ', '_')}"
    engine.save_pretrained(save_dir)

    got = full_named_parameters(engine)  # the trained weights, gathered by the test's own path
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, got)
    if rank == 0:
        trained = copy.deepcopy(untrained)
        full = {k: v for p in parts for k, v in p.items()}
        missing, unexpected = trained.load_state_dict(full, strict=False)
        assert not unexpected and all("rotary" in k or "position_ids" in k for k in missing), missing
        loaded = AutoModelForImageTextToText.from_pretrained(save_dir, dtype=torch.float32).eval()
        kw = hf_inputs(family, untrained, held_out)
        with torch.no_grad():
            ref, new, old = (m(**kw).logits for m in (trained, loaded, untrained))
        out["logits_diff"] = (new - ref).abs().max().item()
        out["control_diff"] = (old - new).abs().max().item()
        out["compared"] = ref.numel()
        out["files"] = sorted(__import__("os").listdir(save_dir))
    dist.barrier()
    return out


def _suite(rank, world_size, tmp):
    return {name: _case(rank, tmp, name, **case) for name, case in CASES.items()}


def test_eval_batch_and_save_pretrained(tmp_path):
    results = run_distributed(_suite, world_size=4, timeout=600, tmp=str(tmp_path))
    for name in CASES:
        per_rank = [r[name] for r in results]
        for got, want in per_rank[0]["eval"]:
            assert got == pytest.approx(want, rel=1e-6, abs=0), name
        assert all(r["eval"] == per_rank[0]["eval"] for r in per_rank), f"{name}: eval loss differs across ranks"
        full_got, full_loss = per_rank[0]["eval"][0]
        control_got, control_want = per_rank[0]["eval_control"]
        assert abs(control_want - full_loss) > 1e-4 and abs(control_got - full_got) > 1e-4, name  # the check can fail
        assert control_got == pytest.approx(control_want, rel=1e-6, abs=0), name
        assert all(r["eval_control"] == per_rank[0]["eval_control"] for r in per_rank), name
        assert all("eval_batch: sample 3" in r.get("bad_sample", "") for r in per_rank), name
        r0 = per_rank[0]
        assert r0["compared"] > 0 and r0["logits_diff"] <= 1e-6, (name, r0["logits_diff"])
        assert r0["control_diff"] > 1e-3, (name, r0["control_diff"])  # training moved the weights
        assert "model.safetensors.index.json" in r0["files"] and "config.json" in r0["files"], r0["files"]
