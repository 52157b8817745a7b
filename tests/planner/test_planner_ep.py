"""Expert parallelism in the planner (no processes): the Qwen3-VL-MoE shapes against the models built on
the meta device, the ep axis of the search (ep folded out of the language's cp x dp, the Megatron
baseline's too), the dispatch all-to-all and the experts' gradient reduction priced by hand count, the
experts' memory divided by ep; negative checks: an ep the engine refuses is never generated (nor ep on
a dense model), and the checks the planner relies on refuse it."""

import json
import os
from dataclasses import replace

import pytest

from ds_hetero.errors import HeteroConfigError
from ds_hetero.planner import machine_profile, plan
from ds_hetero.planner.candidate import Candidate, StageChoice
from ds_hetero.planner.collectives import dispatch_bytes, language_collectives
from ds_hetero.planner.enumerate import expert_degrees
from ds_hetero.planner.flops import language_work
from ds_hetero.planner.memory import language_memory
from ds_hetero.planner.model_source import load_model
from ds_hetero.planner.model_spec import model_spec
from ds_hetero.planner.search import base_config
from ds_hetero.planner.validity import check_candidate
from ds_hetero.planner.workload import Workload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "ds_configs", "planner")


@pytest.fixture(scope="module")
def tiny():
    cfg, model = load_model("tiny-qwen3-vl-moe")
    return model_spec(cfg), model


@pytest.fixture(scope="module")
def tiny_plan():
    return plan("tiny-qwen3-vl-moe", 4, 96, 16, 8, machine_profile("h100"))


def _experts_numel(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)


@pytest.mark.parametrize("name", ["tiny", "qwen3vl_30b_a3b.json", "qwen3vl_235b_a22b.json"])
def test_moe_shapes_match_the_meta_models(name, tiny):
    if name == "tiny":
        spec, model = tiny
    else:
        cfg, model = load_model(os.path.join(CONFIGS, name))
        spec = model_spec(cfg)
    lm = spec.language
    assert spec.family == "qwen3_vl_moe" and lm.moe
    assert spec.params() == sum(p.numel() for p in model.parameters())
    assert lm.expert_params() == _experts_numel(model)
    router = sum(p.numel() for n, p in model.named_parameters() if n.endswith(".mlp.gate.weight"))
    assert router == lm.layers * lm.router_params()
    if name != "tiny":  # the public configs: 128 experts, top-8, ~3B / ~22B active
        assert (lm.experts, lm.top_k) == (128, 8)
        active = lm.params() - lm.expert_params() + lm.expert_params() * lm.top_k // lm.experts
        assert active / 1e9 == pytest.approx(3.35 if "30b" in name else 22.2, abs=0.1)


def test_experts_per_rank_divide_by_ep_and_not_by_tp(tiny):
    spec, model = tiny
    lm = spec.language
    for tp, ep in ((1, 1), (2, 1), (1, 2), (2, 2), (1, 8)):
        whole = lm.params_per_rank(tp, 1) - lm.expert_params()
        assert lm.params_per_rank(tp, ep) == whole + _experts_numel(model) // ep
        chunk = __import__("ds_hetero.models.shapes", fromlist=["x"]).chunk_params_per_rank(spec, tp, lm.layers, True,
                                                                                              True, ep)
        assert chunk == pytest.approx(lm.params_per_rank(tp, ep), rel=1e-6)


def test_an_unpriced_mix_of_dense_and_moe_layers_is_refused_by_name(tiny):
    cfg = tiny[1].config.to_dict()
    cfg["text_config"]["mlp_only_layers"] = [0]
    with pytest.raises(ValueError, match="mlp_only_layers"):
        model_spec(cfg)


def test_dispatch_all_to_all_hand_count(tiny):
    spec, _ = tiny
    lm = spec.language
    wl = Workload(seq_len=96, image_tokens=16, global_batch=8, dtype_bytes=2)
    for sp, tp in ((False, 1), (False, 2), (True, 2)):
        layout = StageChoice(tp, 4 // tp, 1, sp, ep=2)
        colls = [c for c in language_collectives(spec, wl, 2, layout) if c.axis == "ep"]
        routed = 2 * 96 / (tp if sp else 1)  # every tp rank routes the shard's tokens unless sp splits them
        rows = [c for c in colls if c.kind == "all_to_all" and c.count == 4 * lm.layers]
        assert len(rows) == 1 and rows[0].nbytes == routed * lm.top_k * lm.hidden * 2 and rows[0].group == 2
        assert dispatch_bytes(spec, wl, 2, layout) == (routed * lm.top_k * lm.hidden * 2 * lm.layers,
                                                       routed * lm.top_k * lm.hidden * 2 * lm.layers / 2)
    # ep 1: no exchange (only the aux loss's all-reduce of the routing counts)
    colls = language_collectives(spec, wl, 2, StageChoice(1, 4))
    assert not [c for c in colls if c.kind == "all_to_all"]
    assert [c.nbytes for c in colls if c.axis == "ep"] == [lm.layers * (lm.experts + 1) * 4]


def test_expert_gradients_are_reduced_over_the_expert_data_parallel_ranks(tiny):
    spec, _ = tiny
    lm = spec.language
    wl = Workload(seq_len=96, image_tokens=16, global_batch=8, dtype_bytes=2, zero=0)
    for dp, ep in ((4, 1), (4, 2), (4, 4)):
        colls = language_collectives(spec, wl, 2, StageChoice(1, dp, ep=ep))
        dense = [c for c in colls if c.axis == "dp"]
        experts = [c for c in colls if c.axis == "edp"]
        assert [(c.group, c.nbytes) for c in dense] == [(dp, (lm.params_per_rank(1, ep) - lm.expert_params(ep)) * 2)]
        if dp // ep == 1:  # every rank holds different experts: nothing to reduce
            assert experts == []
        else:
            assert [(c.group, c.nbytes) for c in experts] == [(dp // ep, lm.expert_params(ep) * 2)]


def test_expert_states_divide_by_ep(tiny):
    spec, _ = tiny
    lm = spec.language
    for zero in (0, 1, 3):
        wl = Workload(seq_len=96, image_tokens=16, global_batch=8, dtype_bytes=2, zero=zero)
        states = {ep: language_memory(spec, wl, Candidate("colocated", StageChoice(1, 4), StageChoice(1, 4, ep=ep), 1),
                                      True, 0, 1).states for ep in (1, 2, 4)}
        if zero == 3:  # ZeRO 3 partitions E / ep experts over cp x dp / ep ranks: 1 / (cp x dp) of them either way
            assert states[1] == pytest.approx(states[2]) == pytest.approx(states[4])
            continue
        assert states[1] > states[2] > states[4]
        if zero == 1:  # the bf16 parameters and gradients divide by ep; the fp32 partition is 1 / (cp x dp) anyway
            assert states[1] - states[2] == pytest.approx(lm.expert_params(2) * (2 + 2))
        if zero == 0:  # parameters, gradients (2 bytes), two fp32 moments, per expert parameter held
            assert states[1] - states[2] == pytest.approx(lm.expert_params(2) * (2 + 2 + 8))


def test_expert_flops_per_rank_are_the_assignments_it_receives(tiny):
    spec, _ = tiny
    lm = spec.language
    wl = Workload(seq_len=96, image_tokens=16, global_batch=8, dtype_bytes=2)
    one = language_work(spec, wl, 2, 1, 1, 1.0, ep=1)
    four = language_work(spec, wl, 2, 1, 1, 1.0, ep=4)
    experts = lambda w: sum(g.flops for g in w.gemms if (g.k, g.n) in ((lm.hidden, 2 * lm.moe_ffn), (lm.moe_ffn, lm.hidden)))
    # balanced routing: the same assignments (tokens x top_k) per rank, over E / ep experts
    assert experts(one) == experts(four) == 2 * 96 * lm.top_k * 2 * 3 * lm.hidden * lm.moe_ffn * lm.layers
    assert four.ops < one.ops  # fewer local experts, fewer per-expert calls


def test_ep_is_a_search_axis_of_the_moe_family(tiny_plan):
    p = tiny_plan
    eps = {x.candidate.language.ep for x in p.predictions}
    assert eps == {1, 2, 4}
    for x in p.predictions:
        lang = x.candidate.language
        assert (lang.cp * lang.dp) % lang.ep == 0 and 8 % lang.ep == 0
    # the Megatron baseline has ep too, and every runnable row's config passes the engine's checks
    assert {x.candidate.language.ep for x in p.predictions if x.candidate.megatron} == {1, 2, 4}
    best = p.best
    cfg = p.ds_config(best)
    check_candidate(cfg, 4, None)
    assert cfg["hetero_parallel"]["stages"]["language"].get("ep", 1) == best.candidate.language.ep
    # a MoE plan's breakdown prices the exchange where ep > 1
    moe = next(x for x in p.predictions if x.candidate.language.ep == 4 and not x.candidate.megatron)
    assert moe.breakdown["language"]["ep"] > 0


def test_negative_ep_is_not_generated_where_the_engine_refuses_it(tiny_plan):
    # ep 3 divides neither the 8 experts nor cp x dp = 4: never generated ...
    assert expert_degrees(8, 4) == [1, 2, 4] and expert_degrees(8, 6) == [1, 2] and expert_degrees(0, 8) == [1]
    # ... and the checks the planner relies on refuse it, naming the field
    _, model = load_model("tiny-qwen3-vl-moe")
    from ds_hetero.families import adapter_for

    adapter = adapter_for(model)
    base = base_config(None, 8, None, True)
    bad = Candidate("colocated", StageChoice(1, 8), StageChoice(1, 8, ep=8), 1)
    ok = replace(bad, language=StageChoice(1, 8, ep=4))
    check_candidate(ok.ds_config(base), 8, adapter)
    bad = replace(bad, language=StageChoice(1, 6, ep=3), encoders=StageChoice(1, 6))
    with pytest.raises(HeteroConfigError, match="ep"):
        check_candidate(dict(bad.ds_config(base), train_batch_size=6), 6, adapter)
    # a dense model gets no ep > 1 candidate at all
    dense = plan("tiny-qwen2-vl", 4, 96, 16, 8, machine_profile("h100"), modelled=False)
    assert {x.candidate.language.ep for x in dense.predictions} == {1}
    assert "ep" not in dense.predictions[0].breakdown["language"]


def test_gpu_scale_moe_configs_are_their_public_shapes():
    with open(os.path.join(CONFIGS, "qwen3vl_30b_a3b.json")) as f:
        t = json.load(f)["text_config"]
    assert (t["hidden_size"], t["num_hidden_layers"], t["moe_intermediate_size"], t["num_experts"]) == (2048, 48, 768, 128)


def test_plain_deepspeed_baseline_with_ep(tiny):
    from ds_hetero.planner.baselines import plain_deepspeed_step

    spec, _ = tiny
    wl = Workload(seq_len=96, image_tokens=16, global_batch=8, dtype_bytes=2)
    machine = machine_profile("h100")
    one, two = plain_deepspeed_step(spec, wl, machine, 4), plain_deepspeed_step(spec, wl, machine, 4, ep=2)
    assert one != two and one > 0 and two > 0
    dense = model_spec(load_model("tiny-qwen2-vl", build=False)[0])
    with pytest.raises(ValueError, match="ep=2"):
        plain_deepspeed_step(dense, wl, machine, 4, ep=2)


def test_qwen3_5_moe_is_on_the_ep_axis_with_its_shared_expert_priced():
    """Qwen3.5-MoE's spec carries the MoE fields (so the search folds ep out of it) and a shared expert every
    token passes through, priced as a dense SwiGLU split over tp. Negative check: the same spec without the
    shared expert prices exactly those GEMMs less."""
    cfg, _ = load_model("tiny-qwen3.5-moe")
    spec = model_spec(cfg)
    lm = spec.language
    assert spec.family == "qwen3_5_moe" and lm.moe and lm.shared_ffn > 0
    assert set(expert_degrees(lm.experts, 4)) >= {1, 2}
    wl = Workload(seq_len=96, image_tokens=16, global_batch=8, dtype_bytes=2)
    tokens, tp = 2 * 96, 2
    work = language_work(spec, wl, 2, tp, 1, 1.0, ep=2)
    bare = language_work(replace(spec, language=replace(lm, shared_ffn=0)), wl, 2, tp, 1, 1.0, ep=2)
    shared = 2 * tokens * 3 * lm.hidden * (lm.shared_ffn // tp) * lm.layers  # forward GEMMs: gate, up, down
    assert sum(g.flops for g in work.gemms) - sum(g.flops for g in bare.gemms) == shared


def test_validate_takes_the_tiny_moe_model_and_the_planner_plans_it(capsys):
    """`validate` and `plan` agree on the MoE model (the planner's ep axis: tests/planner/test_planner_ep.py)."""
    import pathlib

    from ds_hetero.cli import main

    root = pathlib.Path(__file__).resolve().parents[2]
    assert main(["validate", str(root / "ds_configs/qwen3_vl_moe_ep.json"), "--world-size", "4",
                 "--model", "tiny-qwen3-vl-moe"]) == 0
    assert "valid for 4 ranks" in capsys.readouterr().out
    assert main(["plan", "--model", "tiny-qwen3-vl-moe", "--world-size", "4", "--seq-len", "64",
                 "--image-tokens", "16", "--global-batch", "8", "--machine", "h100", "--top", "3"]) == 0
    assert "ep" in capsys.readouterr().out
