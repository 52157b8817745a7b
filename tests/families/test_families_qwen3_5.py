"""Qwen3.5 dense: Gated DeltaNet (linear-attention) layers sharded over tp by heads, against the unsharded
layer and the single-process Hugging Face model.

One 4-rank launch (ds_hetero/testing/cases.py) runs:
- the Gated DeltaNet layer alone, sharded over tp 2 (ranks 0-1 and 2-3) by the family's plan: its output,
  input gradient and every parameter's gradient (gathered) equal the unsharded layer's (fp64, 1e-10),
  with padding in the batch; negative control: the same layer split plainly (in_proj_qkv and conv1d
  cut in tp contiguous blocks instead of q, k and v each by heads) differs;
- the family through `ds_hetero.initialize`, fp32, 5 steps, clipping active, against the fused model's
  own `model(**batch).loss` (losses 1e-5 relative, norms 1e-4, every weight 1e-5): vision dp4 +
  language tp2 dp2, and vision dp4 + language tp2 pp2 cut [1, 3] (the first chunk one Gated DeltaNet
  layer, the second two more and the full-attention layer, at other positions than in the whole
  decoder); a wrong reference (each value head paired with the wrong key head) ends far away;
- a checkpoint saved at language tp2 dp2 continues at tp1 dp4 exactly as the run that saved it.
Language cp and sequence parallelism: tests/families/test_qwen3_5_sequence_shards.py; the head-count
refusals without processes below.
"""

import dataclasses

import pytest
import torch

from ds_hetero.testing.cases import launch_cases
from tests.helpers.family_checks import CLIP, check_family_parity

CP2 = {"vision": {"dp": 4}, "language": {"tp": 1, "cp": 2, "dp": 2}}


def _deltanet_shard(rank, world_size, wrong=False):
    import copy

    import torch.distributed as dist

    from ds_hetero.families.qwen3_5.plans import GATED_DELTANET, TP_PLANS
    from ds_hetero.tensor_parallel import gather_full
    from ds_hetero.tensor_parallel.shard_plans import apply_plans, validate_tensor_parallel
    from ds_hetero.toy import tiny_qwen3_5

    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    group = groups[rank // 2]
    plans = dict(TP_PLANS)
    if wrong:  # q | k | v cut as one block: rank 0 gets all of q and half of k, rank 1 the rest
        key = next(k for k, p in plans.items() if p is GATED_DELTANET)
        plans[key] = dataclasses.replace(GATED_DELTANET, fused=(),
                                         column=GATED_DELTANET.column + ("in_proj_qkv", "conv1d"))
    full = tiny_qwen3_5(seed=3).model.language_model.layers[0].linear_attn.double()
    shard = copy.deepcopy(full)
    apply_plans(validate_tensor_parallel(shard, 2, "language", plans=plans), group)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 11, full.hidden_size, generator=gen, dtype=torch.float64)
    g = torch.randn(2, 11, full.hidden_size, generator=gen, dtype=torch.float64)
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, -3:] = 0  # a padded sample: the layer zeroes its padding positions
    out = {}
    for name, layer in (("full", full), ("shard", shard)):
        xi = x.clone().requires_grad_(True)
        y = layer(hidden_states=xi, attention_mask=mask)
        y.backward(g)
        grads = {n: gather_full(p.grad, p, group) for n, p in layer.named_parameters()}
        out[name] = (y.detach(), xi.grad, grads)
    (y, gx, grads), (ys, gxs, grads_s) = out["full"], out["shard"]
    err = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
    return {"out": err(ys, y), "input_grad": err(gxs, gx),
            "grads": {n: err(grads_s[n], grads[n]) for n in grads},
            "sharded": sorted(n for n, p in shard.named_parameters() if getattr(p, "tensor_model_parallel", False))}


def _train(rank, world_size, layout, **kw):
    from tests.helpers.family_parity import train_family

    return train_family(rank, world_size, "qwen3_5", layout, steps=5, clip=CLIP, **kw)


def _checkpoint_reshard(rank, world_size, tmp):
    """Save at language tp2 dp2 after 2 steps, continue 2 steps; load the checkpoint at language
    tp1 dp4 into other initial weights and take the same 2 steps: the losses and weights agree
    (the unequal-segment shards merge back through the manifest's JSON strides)."""
    import os

    import ds_hetero
    from ds_hetero.testing.parity import full_named_parameters
    from tests.helpers.family_parity import build_model, make_batches

    def engine_for(language, seed):
        config = {"train_batch_size": 8, "gradient_clipping": CLIP, "zero_optimization": {"stage": 1},
                  "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
                  "hetero_parallel": {"micro_batches": 2, "stages": {"vision": {"dp": 4}, "language": language}}}
        return ds_hetero.initialize(build_model("qwen3_5", seed=seed), config, optimizer=lambda p: torch.optim.AdamW(
            p, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01))

    batches = make_batches("qwen3_5", build_model("qwen3_5", seed=7), 4, 8)
    engine = engine_for({"tp": 2, "dp": 2}, 7)
    [engine.train_batch(s) for s in batches[:2]]
    path = os.path.join(tmp, "ckpt")
    engine.save_checkpoint(path)
    want = [engine.train_batch(s).loss for s in batches[2:]]
    want_weights = full_named_parameters(engine)
    engine.groups.destroy()
    engine = engine_for({"tp": 1, "dp": 4}, 99)
    engine.load_checkpoint(path)
    got = [engine.train_batch(s).loss for s in batches[2:]]
    got_weights = full_named_parameters(engine)
    engine.groups.destroy()
    rel = max(float((got_weights[n] - w).abs().max() / w.abs().max().clamp_min(1e-12)) for n, w in want_weights.items())
    return {"want": want, "got": got, "weight_rel": rel, "compared": len(want_weights)}


TP2 = "vision dp4 + language tp2dp2 zero1 adamw"
PP2 = "vision dp4 + language tp2 pp2 [1, 3] zero1 adamw"
CASES = {
    "deltanet": (_deltanet_shard, {}),
    "deltanet wrong split": (_deltanet_shard, {"wrong": True}),
    TP2: (_train, dict(layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=1, wrong=True)),
    PP2: (_train, dict(layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 1, "pp": 2, "pp_layers": [1, 3]}},
                       zero_stage=1, micro_batches=4, wrong=True)),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cases = {**CASES, "checkpoint": (_checkpoint_reshard, {"tmp": str(tmp_path_factory.mktemp("qwen3_5"))})}
    return launch_cases(cases, world_size=4, timeout=1500)


@pytest.mark.distributed
def test_gated_deltanet_tp_shard_equals_the_unsharded_layer(results):
    for r in results["deltanet"]:
        assert r["out"] < 1e-10 and r["input_grad"] < 1e-10, r
        assert max(r["grads"].values()) < 1e-10, r["grads"]
        # everything but the per-head norm is split: A_log, dt_bias, conv1d, every projection
        assert r["sharded"] == ["A_log", "conv1d.weight", "dt_bias", "in_proj_a.weight", "in_proj_b.weight",
                                "in_proj_qkv.weight", "in_proj_z.weight", "out_proj.weight"], r["sharded"]


@pytest.mark.distributed
def test_gated_deltanet_wrong_head_split_differs(results):
    for r in results["deltanet wrong split"]:
        assert r["out"] > 1e-2, r


@pytest.mark.distributed
def test_qwen3_5_tp2_and_tp2_pp2_match_the_single_process_reference(results):
    check_family_parity([{TP2: a, PP2: b} for a, b in zip(results[TP2], results[PP2])])


@pytest.mark.distributed
def test_checkpoint_saved_at_tp2_continues_at_tp1(results):
    for r in results["checkpoint"]:
        assert r["compared"] > 0 and r["weight_rel"] <= 1e-5, r
        for got, want in zip(r["got"], r["want"], strict=True):
            assert abs(got - want) <= 1e-5 * abs(want), r


def test_validate_checks_sequence_shards_by_head_counts():
    """cp 2 and sequence parallelism are valid (the Gated DeltaNet heads split over cp); tp x cp not
    dividing the 4 linear-attention value heads (cp 8) is refused, naming the cp field."""
    from ds_hetero.config import load_config
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.toy import tiny_qwen3_5
    from ds_hetero.validation import check_model

    model = tiny_qwen3_5()
    base = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    for stages in (CP2, {"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2, "sequence_parallel": True}},
                   {"vision": {"dp": 4}, "language": {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}}):
        check_model(load_config({**base, "hetero_parallel": {"micro_batches": 2, "stages": stages}}, 4), model)
    cp8 = load_config({**base, "hetero_parallel": {"micro_batches": 1, "stages": {
        "vision": {"dp": 8}, "language": {"cp": 8, "dp": 1}}}}, 8)
    with pytest.raises(HeteroConfigError, match="4 linear-attention value heads") as exc:
        check_model(cp8, model)
    assert exc.value.field == "hetero_parallel.stages.language.cp", exc.value
    ok = load_config({**base, "hetero_parallel": {"micro_batches": 2, "stages": {
        "vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}}}, 4)
    check_model(ok, model)  # tp 2 divides both linear-attention head counts (4 value, 2 key)
    bad = load_config({**base, "hetero_parallel": {"micro_batches": 1, "stages": {
        "vision": {"dp": 8}, "language": {"tp": 4, "dp": 2}}}}, 8)
    with pytest.raises(HeteroConfigError, match="linear-attention key heads"):
        check_model(bad, model)


def test_segmented_shards_round_trip():
    """A tuple stride (unequal fused segments) shards each segment and merges back; the loader's
    row runs (weights/shard_slices.py) are the same rows."""
    from ds_hetero.tensor_parallel.layers import merge_shards, shard_tensor

    full = torch.arange(20.0).reshape(20, 1)
    stride = (4, 4, 12)
    pieces = [shard_tensor(full, 0, r, 2, stride) for r in range(2)]
    assert pieces[0].flatten().tolist() == [0, 1, 4, 5] + list(range(8, 14))
    torch.testing.assert_close(merge_shards(pieces, 0, list(stride), 20), full)

