"""Expert parallelism on the language stage, with Qwen3-VL-MoE, against the single-process HF model.

fp32, 5 steps, AdamW, ZeRO 0-3, clipping active (CLIP 0.05, below every step's norm): losses (the model's own
`model(**batch).loss`, aux loss included) within 1e-5 relative, global norms 1e-4, every updated
weight (experts gathered over ep) 1e-5, on 4 ranks: vision dp4 + language tp2 dp2 ep2 and
vision dp4 + language dp4 ep4 (one micro-batch each: the aux loss is the global batch's),
language dp4 ep2 with 2 micro-batches (the aux loss per micro-batch, averaged: docs/expert-parallel.md),
language tp2 dp2 with sequence parallelism ep2, language cp2 dp2 ep4 with 2 micro-batches, and
language dp4 ep2 with ZeRO 3 (each expert partitioned over its 2 expert-data-parallel ranks),
language tp2 dp2 ep2 with packed rows (`language_batching` "packed", one micro-batch, per-sample attention),
a frozen router with recompute (tp2 dp2 ep2), frozen experts under ZeRO 3 (and refused under ZeRO 2),
and pipelined: language dp2 pp2 ep2 with 4 micro-batches (ZeRO 1, and ZeRO 3), language tp2 pp2
with sequence parallelism (ep 1): the experts on both pipeline stages, the aux loss over every
layer of each micro-batch (its sums carried between the pipeline stages), and eval_batch after it.
StepResult.aux_loss equals the model's aux loss (the mean of the micro-batches' with several).
Negative controls, each of which must fail the same bar: routing with a capacity that drops
assignments, routing to the wrong expert rank, the aux loss computed per rank, with 2
micro-batches a reference whose aux loss is the whole batch's (the rule must matter), and with
pp2 each pipeline stage's aux loss over its own layers only.
The dispatch and combine all-to-alls pass an adjoint test; save_pretrained from ep2 tp2 is the
engine's weights and loads per shard into ep4 with the same eval loss; a training checkpoint moves ep2 -> ep1
-> ep4, disaggregated -> colocated -> disaggregated, and pipelined (pp2 dp2 ep2, each chunk's files apart) ->
colocated -> pipelined, and pp2 dp2 ep2 ZeRO 3 -> tp2 dp2 ep2 ZeRO 1 -> pp2 dp2 ep2 ZeRO 3 (tests/helpers/moe_checkpoints.py;
experts loaded from the wrong ep slot, or ZeRO 3's model partitions left unset, miss the bar) and PEFT LoRA on attention and experts trains (moe_lora.py) like the
single-process runs; the main job's script runs the family with ep. The pure checks (groups, config errors) run without processes.

Qwen3.5-MoE (Gated DeltaNet layers by heads over tp, a shared expert over tp, routed experts over ep)
in the same launch, to the same bar: vision dp4 + language tp2 dp2 ep2 (ZeRO 1), language dp4 ep4
with 2 micro-batches and language dp2 pp2 ep2 with 4 micro-batches (eval too); routing to the wrong expert rank must fail; save_pretrained (each expert stored
apart) and per-shard loading into ep4 reading a quarter of the experts; each rank's parameter count as
the planner's; the main job with `--model-family qwen3.5-moe`.
"""

import pytest

from ds_hetero.errors import HeteroConfigError
from ds_hetero.layout import StageLayout

RTOL, ATOL = 1e-5, 1e-6
V = {"tp": 1, "dp": 4}
LAYOUTS = {
    # ep 1: the experts replicated, the aux loss still the global batch's (counts over dp)
    "vision dp4 + language tp2 dp2 (ep 1) zero1": dict(layout={"vision": V, "language": {"tp": 2, "dp": 2}},
                                                       zero_stage=1),
    "vision dp4 + language tp2 dp2 ep2 zero0": dict(layout={"vision": V, "language": {"tp": 2, "dp": 2, "ep": 2}}),
    # packed rows (one micro-batch: the aux loss is still the global batch's), attended per sample
    "vision dp4 + language tp2 dp2 ep2, packed": dict(layout={"vision": V, "language": {"tp": 2, "dp": 2, "ep": 2}},
                                                     hetero={"language_batching": "packed"}),
    "vision dp4 + language dp4 ep4 zero2": dict(layout={"vision": V, "language": {"tp": 1, "dp": 4, "ep": 4}},
                                                zero_stage=2),
    "language dp4 ep2, 2 micro-batches, zero1": dict(layout={"vision": V, "language": {"tp": 1, "dp": 4, "ep": 2}},
                                                     micro_batches=2, zero_stage=1),
    # sequence shards: under sp the tp ranks route different tokens (expert and router gradients
    # summed over tp, the aux counts over tp x dp x cp); under cp ep folds over the cp ranks too
    "language tp2 dp2 sequence parallel ep2": dict(
        layout={"vision": V, "language": {"tp": 2, "dp": 2, "sequence_parallel": True, "ep": 2}}),
    "language cp2 dp2 ep4, 2 micro-batches": dict(
        layout={"vision": V, "language": {"tp": 1, "cp": 2, "dp": 2, "ep": 4}}, micro_batches=2),
    # ZeRO 3: every expert partitioned over its expert-data-parallel group (2 ranks), dense weights over dp
    "language dp4 ep2 zero3": dict(layout={"vision": V, "language": {"tp": 1, "dp": 4, "ep": 2}}, zero_stage=3),
    # a frozen router (the aux loss still trains the layers below it) with every layer recomputed
    "language tp2 dp2 ep2, frozen router, recompute": dict(
        layout={"vision": V, "language": {"tp": 2, "dp": 2, "ep": 2, "recompute": True,
                                          "freeze": ["*.mlp.gate.weight"]}}),
    "language dp4 ep2 zero3, frozen experts": dict(
        layout={"vision": V, "language": {"tp": 1, "dp": 4, "ep": 2, "freeze": ["*.mlp.experts.*"]}}, zero_stage=3),
    # pipelined: the experts on both pipeline stages (layers 0-1 | 2), the aux loss's sums carried
    # between them (expert_parallel/aux_loss.py); 4 micro-batches of 2 samples, 1 per dp rank
    "language dp2 pp2 ep2, 4 micro-batches, zero1": dict(
        layout={"vision": V, "language": {"dp": 2, "pp": 2, "ep": 2}}, micro_batches=4, zero_stage=1, evaluate=True),
    "language dp2 pp2 ep2, 4 micro-batches, zero3": dict(
        layout={"vision": V, "language": {"dp": 2, "pp": 2, "ep": 2}}, micro_batches=4, zero_stage=3),
    # pp without ep (the experts replicated), under sequence parallelism (the counts over tp too)
    "language tp2 pp2 sequence parallel (ep 1), 2 micro-batches": dict(
        layout={"vision": V, "language": {"tp": 2, "dp": 1, "pp": 2, "sequence_parallel": True}}, micro_batches=2,
        evaluate=True),
    # Qwen3.5-MoE: Gated DeltaNet layers by heads over tp, routed experts over ep, the shared expert over tp
    "qwen3.5-moe vision dp4 + language tp2 dp2 ep2 zero1": dict(
        layout={"vision": V, "language": {"tp": 2, "dp": 2, "ep": 2}}, zero_stage=1, family="qwen3_5_moe"),
    "qwen3.5-moe language dp4 ep4, 2 micro-batches": dict(
        layout={"vision": V, "language": {"tp": 1, "dp": 4, "ep": 4}}, micro_batches=2, family="qwen3_5_moe"),
    # pipelined: two Gated DeltaNet layers | a Gated DeltaNet and the full-attention layer, experts on both
    "qwen3.5-moe language dp2 pp2 ep2, 4 micro-batches": dict(
        layout={"vision": V, "language": {"dp": 2, "pp": 2, "ep": 2}}, micro_batches=4, zero_stage=1,
        family="qwen3_5_moe", evaluate=True),
}
PP = "language dp2 pp2 ep2, 4 micro-batches, zero1"
CONTROLS = ("drop", "wrong_rank", "per_rank_aux", "global_aux_over_micro_batches", "per_stage_aux",
            "qwen3.5-moe wrong_rank")


def _cases(tmp):
    from tests.helpers.moe_checkpoints import checkpoint_chain, disaggregated_chain, pipelined_chain, zero3_chain
    from tests.helpers.moe_lora import LORA, train_moe_lora
    from tests.helpers.moe_parity import dispatch_adjoint, save_and_load, train_moe

    cases = {"adjoint": (dispatch_adjoint, {})}
    cases.update({name: (train_moe, kw) for name, kw in LAYOUTS.items()})
    ep4 = LAYOUTS["vision dp4 + language dp4 ep4 zero2"]["layout"]
    cases.update({c: (train_moe, dict(layout=ep4, steps=2, control=c)) for c in CONTROLS[:3]})
    # the engine's per-micro-batch rule against a reference taking one aux loss over the whole batch
    cases[CONTROLS[3]] = (train_moe, dict(LAYOUTS["language dp4 ep2, 2 micro-batches, zero1"], steps=2,
                                          reference_micro_batches=1))
    # pp2: each pipeline stage's aux loss over its own layers (averaged over the stages)
    cases[CONTROLS[4]] = (train_moe, dict(LAYOUTS[PP], steps=2, evaluate=False, control=CONTROLS[4]))
    cases[CONTROLS[5]] = (train_moe, dict(LAYOUTS["qwen3.5-moe vision dp4 + language tp2 dp2 ep2 zero1"], steps=2,
                                          control="wrong_rank"))
    cases["checkpoint chain"] = (checkpoint_chain, dict(tmp=tmp))
    cases["disaggregated checkpoint chain"] = (disaggregated_chain, dict(tmp=tmp))
    cases["pipelined checkpoint chain"] = (pipelined_chain, dict(tmp=tmp))
    control = dict(LORA["lora tp2 dp2 ep2 zero1"], steps=2, control="contiguous_b", reload=None)
    for name, kw in {**LORA, "lora contiguous_b": control}.items():  # PEFT LoRA on attention and experts
        cases[name] = (train_moe_lora, dict(kw, tmp=f"{tmp}/{name.replace(' ', '_')}"))
    cases["save_and_load"] = (save_and_load, dict(tmp=tmp, layout=LAYOUTS["vision dp4 + language tp2 dp2 ep2 zero0"]["layout"]))
    # its checkpoint stores each expert apart (transformers' conversion for the family): read per expert
    cases["qwen3.5-moe save_and_load"] = (save_and_load, dict(
        tmp=tmp + "/qwen3_5_moe", layout=LAYOUTS["qwen3.5-moe vision dp4 + language tp2 dp2 ep2 zero1"]["layout"],
        family="qwen3_5_moe"))
    cases["recipe"] = (_recipe, dict(tmp=tmp))
    cases["qwen3.5-moe recipe"] = (_recipe, dict(tmp=tmp, family="qwen3.5-moe"))
    cases["frozen experts zero2"] = (_refused, dict(layout={"vision": V, "language": {
        "tp": 1, "dp": 4, "ep": 2, "freeze": ["*.mlp.experts.*"]}}, zero_stage=2))
    # last: no ZeRO 3 engine without a pipeline may follow its pipelined ones (moe_checkpoints.zero3_chain)
    cases["zero3 checkpoint chain"] = (zero3_chain, dict(tmp=tmp))
    return cases


def _refused(rank, world_size, **kw):
    from tests.helpers.moe_parity import train_moe

    try:
        train_moe(rank, world_size, steps=1, **kw)
    except HeteroConfigError as exc:
        return f"{exc.field}: {exc}"
    return None


def _recipe(rank, world_size, tmp, family="qwen3-vl-moe"):
    from tests.helpers.driver_report import load_recipe
    import json
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    recipe = load_recipe(root, "train_llava")
    summary = os.path.join(tmp, f"recipe_{family}.json")
    recipe.main(["--steps", "3", "--samples", "64", "--model-family", family, "--summary-json", summary,
                 "--deepspeed_config", os.path.join(root, "ds_configs", "qwen3_vl_moe_ep.json")])
    if rank == 0:
        with open(summary) as f:
            return json.load(f)
    return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from ds_hetero.testing.cases import launch_cases

    return launch_cases(_cases(str(tmp_path_factory.mktemp("moe"))), world_size=4, timeout=1500)


def _bad(r):
    """Whether a run misses the bar somewhere (losses, norms or weights)."""
    losses = any(abs(g - w) > RTOL * abs(w) for g, w in zip(r["losses"], r["ref_losses"]))
    norms = any(abs(g - w) > 1e-4 * abs(w) for g, w in zip(r["norms"], r["ref_norms"]))
    err, _, abs_err, _ = r["weight_err"]
    return losses or norms or err > RTOL


pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_expert_parallel_matches_single_process_reference(runs, name):
    from tests.helpers.moe_parity import CLIP

    for rank, r in enumerate(runs[name]):
        assert len(r["losses"]) == 5
        for got, want in zip(r["losses"], r["ref_losses"]):
            assert abs(got - want) <= RTOL * abs(want), (rank, r["losses"], r["ref_losses"])
        for got, want in zip(r["norms"], r["ref_norms"]):
            assert abs(got - want) <= 1e-4 * abs(want), (rank, r["norms"], r["ref_norms"])
        assert min(r["ref_norms"]) > CLIP, r["ref_norms"]  # clipping was active
        for got, want in zip(r["aux"], r["ref_aux"]):  # StepResult.aux_loss: the model's aux loss
            assert abs(got - want) <= RTOL * abs(want), (rank, r["aux"], r["ref_aux"])
        err, where, abs_err, compared = r["weight_err"]
        assert compared == r["n_params"], (compared, r["n_params"])  # every weight, experts gathered
        if name == "language dp4 ep2 zero3":  # partitioned over the 2 ranks holding the same experts, half each
            ranks, full, local = r["expert_partition"]
            assert ranks == 2 and local == -(-full // 2), r["expert_partition"]
        assert err <= RTOL and abs_err <= ATOL, (rank, err, where, abs_err)
        if "eval" in r:  # eval_batch after training: the lm loss plus each micro-batch's aux loss, averaged
            got, want = r["eval"]
            assert abs(got - want) <= RTOL * abs(want), (rank, r["eval"])


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n.startswith("qwen3.5-moe") and "pp" not in LAYOUTS[n]["layout"]["language"]])
def test_planner_counts_what_a_qwen3_5_moe_rank_holds(runs, name):
    """families/qwen3_5_moe/shapes.py: a language rank's parameters at its tp and ep (the Gated DeltaNet,
    attention and shared expert split over tp, the routers replicated, E / ep routed experts)."""
    from ds_hetero.families.qwen3_5_moe import tiny_qwen3_5_moe
    from ds_hetero.planner.model_spec import model_spec

    language = LAYOUTS[name]["layout"]["language"]
    lm = model_spec(tiny_qwen3_5_moe().config).language
    for r in runs[name]:
        assert r["language_params"] == lm.params_per_rank(language["tp"], language["ep"]), r["language_params"]


@pytest.mark.parametrize("control", CONTROLS)
def test_negative_controls_fail_the_bar(runs, control):
    for r in runs[control]:
        assert _bad(r), (control, r)


def test_dispatch_and_combine_are_adjoint_and_dropless(runs):
    for r in runs["adjoint"]:
        for ax_y, x_aty in (r["dispatch"], r["combine"]):
            assert abs(ax_y - x_aty) <= 1e-12 * max(1.0, abs(ax_y)), r
        assert r["arrived"] == r["expected"]  # every assignment for this rank's experts, none dropped


@pytest.mark.parametrize("case", ["save_and_load", "qwen3.5-moe save_and_load"])
def test_save_pretrained_and_per_shard_load_across_ep(runs, case):
    for r in runs[case]:
        err, where, _, compared = r["export_err"]
        assert compared > 0 and err == 0.0, (err, where)
        after, reloaded = r["eval"]
        assert abs(after - reloaded) <= RTOL * abs(after), r["eval"]
        read, full = r["experts_read"]  # each ep4 rank read its quarter of the experts only
        assert full > 0 and read * 4 == full, r["experts_read"]


def test_training_checkpoint_reshards_across_ep(runs):  # ep2 -> ep1 -> ep4, its controls (moe_checkpoints.py)
    from tests.helpers.moe_checkpoints import check_chain
    check_chain(runs["checkpoint chain"], RTOL, ATOL)


def test_ep_checkpoint_moves_between_disaggregated_and_colocated(runs):  # moe_checkpoints.py
    from tests.helpers.moe_checkpoints import check_disaggregated_chain
    check_disaggregated_chain(runs["disaggregated checkpoint chain"], RTOL, ATOL)


def test_ep_checkpoint_moves_between_pipelined_and_colocated(runs):  # moe_checkpoints.py, with its control
    from tests.helpers.moe_checkpoints import check_disaggregated_chain
    check_disaggregated_chain(runs["pipelined checkpoint chain"], RTOL, ATOL)


def test_ep_checkpoint_moves_into_and_out_of_zero3(runs):  # moe_checkpoints.py, with its control
    from tests.helpers.moe_checkpoints import check_disaggregated_chain
    check_disaggregated_chain(runs["zero3 checkpoint chain"], RTOL, ATOL)


@pytest.mark.parametrize("name", ["lora tp2 dp2 ep2 zero1", "lora dp4 ep4 zero2"])
def test_lora_on_attention_and_experts_matches_single_process_peft(runs, name):  # moe_lora.py
    from tests.helpers.moe_lora import check_run
    for r in runs[name]:
        check_run(r, RTOL, ATOL)


def test_lora_on_experts_with_b_sliced_contiguously_misses_the_bar(runs):
    for r in runs["lora contiguous_b"]:
        assert _bad(r), r


@pytest.mark.parametrize("case", ["recipe", "qwen3.5-moe recipe"])
def test_main_job_trains_the_moe_family_with_ep(runs, case):
    summary = runs[case][0]
    assert summary is not None and len(summary.get("losses", [1, 2, 3])) >= 1, summary


# ----------------------------------------------------------------------------- pure checks
def test_ep_groups_fold_into_dp_x_cp():
    layout = StageLayout("language", 2, 1, 2, (0, 1, 2, 3), ep=2)
    assert layout.ep_groups() == [(0, 2), (1, 3)]  # per tp rank, its dp peers
    assert layout.edp_groups() == [(0,), (2,), (1,), (3,)]
    layout = StageLayout("language", 1, 2, 4, tuple(range(8)), ep=4)
    assert layout.ep_groups() == [(0, 1, 2, 3), (4, 5, 6, 7)]  # cp fastest, then dp: ep innermost
    assert layout.edp_groups() == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert [layout.ep_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert StageLayout("language", 2, 1, 2, (0, 1, 2, 3)).ep_groups() == []  # ep 1: no group


def _config(language, vision=None, zero=0, **section):
    from ds_hetero.config import load_config

    return load_config({"train_batch_size": 8, "zero_optimization": {"stage": zero},
                        "hetero_parallel": {"placement": "colocated", "micro_batches": 1,
                                            "stages": {"vision": vision or {"dp": 4}, "language": language},
                                            **section}}, world_size=4)


@pytest.mark.parametrize("language, vision, match", [
    ({"dp": 4, "ep": 3}, None, "does not divide cp x dp"),
    ({"tp": 2, "dp": 2, "ep": 4}, None, "does not divide cp x dp"),
    ({"dp": 4}, {"dp": 4, "ep": 2}, "language stage only"),
    ({"dp": 4, "ep": 0}, None, "ep"),
])
def test_config_refuses_bad_ep(language, vision, match):
    with pytest.raises(HeteroConfigError, match=match) as info:
        _config(language, vision)
    assert "ep" in info.value.field


def test_model_checks_name_the_field():
    from ds_hetero.families import adapter_for
    from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe
    from ds_hetero.families.qwen3_vl import tiny_qwen3_vl

    moe = adapter_for(tiny_qwen3_vl_moe())
    moe.check_layouts(_config({"tp": 2, "dp": 2, "ep": 2}))  # valid
    with pytest.raises(HeteroConfigError, match="no experts") as info:
        adapter_for(tiny_qwen3_vl()).check_layouts(_config({"dp": 4, "ep": 2}))
    assert info.value.field.endswith("language.ep")
    with pytest.raises(HeteroConfigError, match="does not divide the 6 experts"):
        adapter_for(tiny_qwen3_vl_moe(num_experts=6)).check_layouts(_config({"dp": 4, "ep": 4}))
    moe.check_layouts(_config({"dp": 4, "ep": 2}, zero=2))  # ZeRO 1/2: MoE optimizer groups over edp
    moe.check_layouts(_config({"dp": 4, "ep": 2}, zero=3))  # ZeRO 3: experts partitioned over edp
    moe.check_layouts(_config({"dp": 2, "pp": 2, "ep": 2}))  # pipelined: experts on every pipeline stage
    moe.check_layouts(_config({"tp": 2, "dp": 1, "pp": 2}))  # pp without ep
    moe.check_layouts(_config({"cp": 2, "dp": 2, "ep": 4}))  # sequence shards: ep folds over cp too
    moe.check_layouts(_config({"tp": 2, "dp": 2, "sequence_parallel": True, "ep": 2}))


def test_qwen3_5_moe_validates_plans_and_refuses_what_it_cannot_run(capsys):
    """`validate` takes tiny-qwen3.5-moe with the MoE job's config; the planner prices it and the dense
    Qwen3.5 (families/qwen3_5*/shapes.py); cp and sequence parallelism are valid (the Gated DeltaNet heads
    split over cp: families/qwen3_5/sequence_shards.py), a cp whose tp x cp does not divide its value heads
    is refused, and so is what the MoE checks refuse (ep dividing the experts), each naming its field."""
    import pathlib

    from ds_hetero.cli import main
    from ds_hetero.config import load_config
    from ds_hetero.families import adapter_for
    from ds_hetero.families.qwen3_5_moe import tiny_qwen3_5_moe

    root = pathlib.Path(__file__).resolve().parents[2]
    assert main(["validate", str(root / "ds_configs/qwen3_vl_moe_ep.json"), "--world-size", "4",
                 "--model", "tiny-qwen3.5-moe"]) == 0
    assert "valid for 4 ranks" in capsys.readouterr().out
    for model in ("tiny-qwen3.5-moe", "tiny-qwen3.5"):
        assert main(["plan", "--model", model, "--world-size", "4", "--seq-len", "64", "--image-tokens", "16",
                     "--global-batch", "8", "--machine", "h100", "--top", "3"]) == 0, capsys.readouterr().err
    moe = adapter_for(tiny_qwen3_5_moe())
    moe.check_layouts(_config({"tp": 2, "dp": 2, "ep": 2}))
    moe.check_layouts(_config({"dp": 4, "ep": 4}, zero=2))
    moe.check_layouts(_config({"cp": 2, "dp": 2, "ep": 2}))
    moe.check_layouts(_config({"tp": 2, "dp": 2, "sequence_parallel": True, "ep": 2}))
    moe.check_layouts(_config({"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}))
    with pytest.raises(HeteroConfigError, match="does not divide the 6 experts") as info:  # 6 experts, ep 4
        adapter_for(tiny_qwen3_5_moe(num_experts=6)).check_layouts(_config({"dp": 4, "ep": 4}))
    assert info.value.field.endswith("language.ep"), info.value.field
    cp8 = load_config({"train_batch_size": 8, "hetero_parallel": {"micro_batches": 1, "stages": {
        "vision": {"dp": 8}, "language": {"cp": 8, "dp": 1}}}}, world_size=8)
    with pytest.raises(HeteroConfigError, match="4 linear-attention value heads") as info:  # tp x cp = 8
        moe.check_layouts(cp8)
    assert info.value.field.endswith("language.cp"), info.value.field


def test_trl_moe_aux_loss_is_accepted_for_a_family_whose_engine_adds_it():
    """TRL's aux_loss_enabled (router_aux_loss_coef != 0 on an MoE model) was refused; the engine now
    adds the aux loss for Qwen3-VL-MoE (from the config TRL sets), so only other families are refused."""
    from types import SimpleNamespace

    from ds_hetero.integrations.trainer.loss_options import loss_problems
    from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe
    from ds_hetero.families.qwen3_vl import tiny_qwen3_vl

    args = SimpleNamespace(label_smoothing_factor=0, loss_type="nll", padding_free=False, packing=False)
    moe = SimpleNamespace(args=args, aux_loss_enabled=True, compute_loss_func=None, model=tiny_qwen3_vl_moe())
    assert not [p for p in loss_problems(moe) if "auxiliary" in p]
    dense = SimpleNamespace(args=args, aux_loss_enabled=True, compute_loss_func=None, model=tiny_qwen3_vl())
    assert [p for p in loss_problems(dense) if "auxiliary" in p]


def test_frozen_experts_under_zero12_are_refused_by_name(runs):
    for msg in runs["frozen experts zero2"]:
        assert msg is not None and msg.startswith("hetero_parallel.stages.language.freeze") and "ZeRO 0 or 3" in msg


@pytest.mark.parametrize("cut", [(0, 3, 5), (0, 1, 2, 5), (0, 5)])
def test_aux_sums_carried_over_pipeline_stages_are_the_models_aux_loss(cut):
    """The pipeline stages' partial sums added stage by stage (aux_loss.add_stage_stats), the value
    formed at the last: HF's load_balancing_loss_func over all layers, and autograd through the
    carried vector gives every layer's logits HF's gradient. Each stage's aux loss over its own
    layers (the negative control's rule) does not."""
    import torch
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import load_balancing_loss_func

    from ds_hetero.expert_parallel.aux_loss import add_stage_stats, aux_of_stats, stage_stats

    gen = torch.Generator().manual_seed(3)
    experts, k, tokens = 8, 2, 13
    logits = [torch.randn(tokens, experts, generator=gen, requires_grad=True) for _ in range(cut[-1])]
    mask = (torch.rand(1, tokens, generator=gen) > 0.3).long()
    want = load_balancing_loss_func(tuple(logits), experts, k, mask)
    want_grad = torch.autograd.grad(want, logits)

    def carried(rule):
        c = None
        for a, b in zip(cut, cut[1:]):
            c = add_stage_stats(c, stage_stats(logits[a:b], mask, k, experts, "cpu"), experts, rule,
                                stages=len(cut) - 1)
        return aux_of_stats(c, experts)

    got = carried("global")
    assert abs(float(got) - float(want)) <= 1e-6 * float(want)
    for g, w in zip(torch.autograd.grad(got, logits), want_grad):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-7)
    if len(cut) > 2:
        assert abs(float(carried("per_stage")) - float(want)) > 1e-4 * float(want)
