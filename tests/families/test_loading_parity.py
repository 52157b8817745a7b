"""A model built on the meta device and filled per stage and per tp shard from a safetensors
checkpoint (`initialize(meta_model(DIR), cfg, weights=DIR)`) trains exactly like the same model
fully built on every rank: same losses (fp32, 1e-6 relative) and same weights after 3 steps,
LLaVA and Qwen2-VL, colocated (vision tp1 dp4, language tp2 dp2) and disaggregated (vision dp2
on ranks 0-1, language tp2 on ranks 2-3); Qwen2-VL also with its vision stage at tp2 (fused qkv
sharded in three segments, patch merger) and the language stage at tp1.

What each rank read is checked from `engine.load_report`: a disaggregated rank reads nothing of
the other stage (its modules stay on meta), a tp2 rank reads exactly half of every sharded
tensor, and the two tp ranks together read every row once. Negative control: loading each tp
rank with its neighbour's rows (a wrong slice offset) changes the first loss far beyond the
tolerance.
"""

import pytest

from ds_hetero.testing.launch import run_distributed
from ds_hetero.testing.parity import build_model, full_named_parameters, make_batches

pytestmark = pytest.mark.distributed

RTOL = 1e-6
STEPS = 3
LAYOUTS = {
    "colocated": {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}},
    "disaggregated": {"vision": {"dp": 2, "ranks": [0, 1]}, "language": {"tp": 2, "dp": 1, "ranks": [2, 3]}},
    "colocated vision tp2": {"vision": {"tp": 2, "dp": 2}, "language": {"tp": 1, "dp": 4}},
}


def _config(layout):
    placement = layout.split()[0]
    return {
        "train_batch_size": 8, "zero_optimization": {"stage": 1}, "gradient_clipping": 0.3,
        "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
        "hetero_parallel": {"placement": placement, "micro_batches": 2 if placement == "colocated" else 4,
                            "stages": LAYOUTS[layout]},
    }


def _optimizer(params):
    import torch

    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)


def _train(engine, batches):
    return [engine.train_batch(samples).loss for samples in batches]


def _report(engine):
    return {stage: vars(load) | {"tensors": len(load.tensors)} for stage, load in engine.load_report.items()}


def _held_meta(engine):
    """Per stage module of the model: how many of its parameters are on meta / real on this rank."""
    out = {}
    for stage, module in engine.adapter.split().items():
        params = list(module.parameters())
        out[stage] = (sum(p.is_meta for p in params), sum(not p.is_meta for p in params))
    return out


def _suite(rank, world_size, family, checkpoint, layouts, control=False):
    import ds_hetero
    import ds_hetero.weights.materialize as materialize

    results = {}
    for placement in layouts:
        batches = make_batches(family, build_model(family, seed=7), STEPS, 8)
        built = ds_hetero.initialize(build_model(family, seed=7), _config(placement), optimizer=_optimizer)
        want = _train(built, batches)
        want_weights = full_named_parameters(built)
        built.groups.destroy()

        loaded = ds_hetero.initialize(ds_hetero.meta_model(checkpoint), _config(placement), optimizer=_optimizer,
                                      weights=checkpoint)
        report, held = _report(loaded), _held_meta(loaded)
        got = _train(loaded, batches)
        got_weights = full_named_parameters(loaded)
        loaded.groups.destroy()
        weight_diff = max((got_weights[n] - w).abs().max().item() for n, w in want_weights.items())
        results[placement] = dict(want=want, got=got, report=report, held=held, weight_diff=weight_diff,
                                  compared=len(want_weights), same_names=sorted(got_weights) == sorted(want_weights))

    if control:  # every tp rank loads its neighbour's rows
        original = materialize.shard_slices
        materialize.shard_slices = lambda p, r, n: original(p, (r + 1) % n, n)
        try:
            wrong = ds_hetero.initialize(ds_hetero.meta_model(checkpoint), _config("colocated"), optimizer=_optimizer,
                                         weights=checkpoint)
            results["wrong offset"] = _train(wrong, batches[:1])
            wrong.groups.destroy()
        finally:
            materialize.shard_slices = original
    return results


def _check(results, layouts, control=False):
    for rank, per_rank in enumerate(results):
        for placement in layouts:
            r = per_rank[placement]
            assert len(r["got"]) == STEPS
            for got, want in zip(r["got"], r["want"]):
                assert abs(got - want) <= RTOL * abs(want), (rank, placement, r["got"], r["want"])
            assert r["compared"] > 0 and r["same_names"], (rank, placement)
            assert r["weight_diff"] <= 1e-6, (rank, placement, r["weight_diff"])
            for stage, load in r["report"].items():  # a tp rank reads 1/tp of each sharded tensor, the rest whole
                tp = LAYOUTS[placement][stage].get("tp", 1)
                assert tp * load["sharded_bytes_read"] == load["sharded_bytes_full"], (placement, stage, load)
                assert (tp == 1) == (load["sharded_bytes_full"] == 0), (placement, stage, load)
                assert load["bytes_read"] - load["sharded_bytes_read"] == load["bytes_full"] - load["sharded_bytes_full"]
        colo, dis = per_rank["colocated"]["report"], per_rank["disaggregated"]["report"]
        # colocated: every rank holds the whole vision stage (tp1) and half of the sharded LLM (tp2)
        assert set(colo) == {"vision", "language"}
        assert colo["vision"]["bytes_read"] == colo["vision"]["bytes_full"] > 0
        assert colo["vision"]["sharded_bytes_full"] == 0
        lang = colo["language"]
        assert lang["sharded_bytes_full"] > 0 and 2 * lang["sharded_bytes_read"] == lang["sharded_bytes_full"]
        assert lang["bytes_read"] - lang["sharded_bytes_read"] == lang["bytes_full"] - lang["sharded_bytes_full"]
        # disaggregated: a rank reads, allocates and holds nothing of the other stage
        mine, other = ("vision", "language") if rank < 2 else ("language", "vision")
        assert set(dis) == {mine}, (rank, dis)
        meta_other, real_other = per_rank["disaggregated"]["held"][other]
        meta_mine, real_mine = per_rank["disaggregated"]["held"][mine]
        assert real_other == 0 and meta_other > 0 and meta_mine == 0 and real_mine > 0, (rank, per_rank["disaggregated"]["held"])
    # the two language tp ranks of the disaggregated layout together read every sharded row once
    assert sum(results[r]["disaggregated"]["report"]["language"]["sharded_bytes_read"] for r in (2, 3)) == \
        results[2]["disaggregated"]["report"]["language"]["sharded_bytes_full"]
    if control:
        for per_rank in results:
            wrong, want = per_rank["wrong offset"][0], per_rank["colocated"]["want"][0]
            assert abs(wrong - want) > 1e3 * RTOL * abs(want), (wrong, want)


def _save(family, directory):
    model = build_model(family, seed=7)
    model.save_pretrained(directory, max_shard_size="200KB")  # several files and an index
    return directory


def test_llava_meta_plus_weights_trains_like_the_built_model(tmp_path):
    checkpoint = _save("llava", str(tmp_path / "llava"))
    layouts = ["colocated", "disaggregated"]
    _check(run_distributed(_suite, world_size=4, timeout=600, family="llava", checkpoint=checkpoint, layouts=layouts,
                           control=True), layouts, control=True)


def test_qwen2_vl_meta_plus_weights_trains_like_the_built_model(tmp_path):
    checkpoint = _save("qwen2_vl", str(tmp_path / "qwen"))
    layouts = list(LAYOUTS)
    _check(run_distributed(_suite, world_size=4, timeout=600, family="qwen2_vl", checkpoint=checkpoint,
                           layouts=layouts), layouts)
