"""Tied input/output embeddings with a pipelined language stage (pp > 1), end to end.

The embedding lives on the first pipeline stage and the head on the last, each rank holding a
copy of the tied weight; their gradients are summed over the embedding group (first and last
pipeline stage at each (tp, cp, dp)) before the gradient norm, which counts the tie once.

Parity bar (as tests/pipeline/test_pipeline_engine.py): fp32, 5 steps of 4 micro-batches, clipping active,
losses within 1e-5 relative of the single-process Hugging Face reference (and of its own
`model(**batch).loss`), gradient norms 1e-4, every weight tensor a rank holds 1e-5 relative; the
tied weight is one tensor in the reference, compared on every rank that holds a copy, and the
copies on the first and the last pipeline stage are equal to the bit. Layouts on 4 ranks:
    tied LLaVA, vision dp4 + language pp2 dp2, ZeRO 1, AdamW
    tied LLaVA, vision dp4 + language pp2 tp2 (vocabulary-parallel embedding and head), ZeRO 2, SGD
    tied LLaVA, vision tp2 dp2 + language pp4 (middle pipeline stages hold no copy), ZeRO 0, SGD
    tied LLaVA, disaggregated: vision dp1 on rank 0 + language pp3 on ranks 1-3, ZeRO 1, AdamW
    tied LLaVA, vision dp4 + language pp2 cp2 (context parallelism), ZeRO 1, AdamW
    tied LLaVA, vision dp4 + language pp2 tp2 with sequence parallelism, ZeRO 2, SGD
    tied LLaVA, first_stage: vision dp2 on pipeline stage 0's ranks + language pp2 dp2, ZeRO 1, AdamW
    tied Qwen2-VL, vision dp4 + language pp2 dp2 (variable image tokens, text-only samples), ZeRO 2, AdamW
Negative controls: the gradients not summed over the embedding group (the first stage's copy
misses the head's gradient: weights far off, copies differ); the head's copy counted in the norm
too (norms off). `save_pretrained` at pp2 tp2 writes the tie once and `from_pretrained` gives a
tied model with the live weights; that checkpoint read per shard (`weights=`) gives each rank
its copy, which stays equal to the other after a step. bf16 (ZeRO 1) trains within bf16 rounding
of fp32 with its copies equal.
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from tests.helpers.tied_pipeline_parity import bf16_tied, run_tied_layouts, save_pretrained_tied

pytestmark = pytest.mark.distributed

RTOL = 1e-5
ATOL = 1e-6
CLIP = 0.3
DISAGG = "tied disaggregated vision dp1 rank 0 + language pp3 ranks 1-3 zero1 adamw"
NO_SUM = "control: pp2dp2 copies' gradients not summed"
NORM_TWICE = "control: pp2dp2 head's copy counted in the norm"
FIRST_STAGE = "tied first_stage vision dp2 + language pp2dp2 zero1 adamw"
# the embedding group pairs the first and last pipeline stage at each (tp, cp, dp): with cp or
# sequence parallelism each pair's copies see their own sequence shard's gradients before the sum
SHARDED_AND_FIRST_STAGE = {
    "tied vision dp4 + language pp2cp2 zero1 adamw": dict(
        layout={"vision": {"dp": 4}, "language": {"cp": 2, "dp": 1, "pp": 2}}, zero_stage=1),
    "tied vision dp4 + language pp2tp2 sequence_parallel zero2 sgd": dict(
        layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 1, "pp": 2, "sequence_parallel": True}},
        zero_stage=2, optimizer="sgd"),
    FIRST_STAGE: dict(
        layout={"vision": {"dp": 2}, "language": {"dp": 2, "pp": 2}}, zero_stage=1, placement="first_stage"),
}


def _llava(rank, world_size):
    return run_tied_layouts(rank, world_size, {
        "tied vision dp4 + language pp2dp2 zero1 adamw": dict(
            layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=1),
        "tied vision dp4 + language pp2tp2 zero2 sgd": dict(
            layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 1, "pp": 2}}, zero_stage=2, optimizer="sgd"),
        "tied vision tp2dp2 + language pp4 zero0 sgd": dict(
            layout={"vision": {"tp": 2, "dp": 2}, "language": {"dp": 1, "pp": 4}}, zero_stage=0, optimizer="sgd"),
        DISAGG: dict(
            layout={"vision": {"dp": 1}, "language": {"dp": 1, "pp": 3}}, zero_stage=1, placement="disaggregated"),
        **SHARDED_AND_FIRST_STAGE,
        NO_SUM: dict(layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=1, optimizer="sgd",
                     steps=2, control="no_sum"),
        NORM_TWICE: dict(layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=1,
                         optimizer="sgd", steps=1, control="norm_twice"),
    })


def _qwen2_vl(rank, world_size):
    return run_tied_layouts(rank, world_size, {
        "tied qwen2-vl vision dp4 + language pp2dp2 zero2 adamw": dict(
            family="qwen2_vl", layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=2),
    })


def _copies(results, name):
    """Every rank's copy of the tied weight in run `name`: [(rank, is the head's copy, value)]."""
    return [(rank, r[name]["tied_copy"]["shared"], r[name]["tied_copy"]["value"])
            for rank, r in enumerate(results) if r[name]["tied_copy"] is not None]


def _check_parity(results, name):
    for rank, per_rank in enumerate(results):
        r = per_rank[name]
        err, where, abs_err, compared = r["weight_err"]
        assert compared > 0, (rank, name)
        assert len(r["losses"]) == len(r["ref_losses"]) == 5, (rank, name)
        for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
            assert abs(got - want) <= RTOL * abs(want), (rank, name, r["losses"], r["ref_losses"])
            assert abs(got - hf) <= RTOL * abs(hf), (rank, name, r["losses"], r["hf_losses"])
        for got, want in zip(r["norms"], r["ref_norms"]):
            assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
        assert min(r["ref_norms"]) > CLIP, r["ref_norms"]  # clipping active on every step
        assert err <= RTOL and abs_err <= ATOL, (rank, name, err, where, abs_err)
    copies = _copies(results, name)
    # a copy on the first pipeline stage and one on the last, at every (tp, cp, dp): 2 x tp x cp x dp ranks
    assert {shared for _, shared, _ in copies} == {False, True}, (name, copies)
    first = [v for _, shared, v in copies if not shared]
    assert all(v == first[0] for _, _, v in copies), (name, "the copies differ")
    for rank, r in enumerate(results):
        c = r[name]["tied_copy"]
        if c is not None:
            assert c["own_group"], (rank, name, "the tied copy is not alone in its optimizer param group")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every distributed check of this module in one 4-rank launch: {case: [its result on each rank]}."""
    saved = tmp_path_factory.mktemp("tied_pipeline")
    cases = {"llava": (_llava, {}), "qwen2_vl": (_qwen2_vl, {}),
             "save_pretrained": (save_pretrained_tied, {"tmp": str(saved)}), "bf16": (bf16_tied, {})}
    return launch_cases(cases, world_size=4, timeout=3000)


def test_tied_llava_pipeline_matches_single_process_reference(launched):
    results = launched["llava"]
    for name in results[0]:
        if not name.startswith("control"):
            _check_parity(results, name)
    # pp4: ranks 0 (first) and 3 (last) hold the copies; the middle pipeline stages none
    assert [rank for rank, _, _ in _copies(results, "tied vision tp2dp2 + language pp4 zero0 sgd")] == [0, 3]
    # disaggregated pp3: ranks 1 (first) and 3 (last); rank 0 holds the encoder only
    assert [rank for rank, _, _ in _copies(results, DISAGG)] == [1, 3]
    # negative control 1: without the sum the first stage's copy misses the head's gradient
    no_sum = _copies(results, NO_SUM)
    assert any(v != no_sum[0][2] for _, _, v in no_sum), "unsummed copies stayed equal: the check cannot fail"
    worst = max(r[NO_SUM]["weight_err"][0] for r, in zip(results) if r[NO_SUM]["pp_coord"] == 0)
    assert worst > 100 * RTOL, worst
    # negative control 2: the tie counted twice in the norm
    r = results[0][NORM_TWICE]
    assert abs(r["norms"][0] - r["ref_norms"][0]) > 1e-2 * r["ref_norms"][0], (r["norms"], r["ref_norms"])


def test_tied_qwen2_vl_pipeline_matches_single_process_reference(launched):
    _check_parity(launched["qwen2_vl"], "tied qwen2-vl vision dp4 + language pp2dp2 zero2 adamw")


def test_tied_pipeline_save_pretrained(launched):
    """pp2 tp2: one tensor for the tie (written by the first pipeline stage), `from_pretrained`
    gives a tied model whose weights are every rank's live weights, and logits equal; per-shard
    loading of that checkpoint gives both copies."""
    results = launched["save_pretrained"]
    # read back per shard (weights=) into the same layout: each rank's weights exactly the live
    # ones, the tied copy is the parameter its pipeline stage holds after the load (ranks 0, 1:
    # the embedding's; 2, 3: the head's), and one step later the copies are still equal
    for rank, r in enumerate(results):
        reload = r["reload"]
        assert reload["same_names"] and reload["weight_diff"] == 0.0, (rank, reload)
        assert reload["copy_is_held"], (rank, reload)
    r = results[0]
    copies = r["copies_after_reload_step"]
    assert len(copies) == 4 and all(c == copies[0] for c in copies), "the reloaded copies differ after a step"
    # one tensor for the tie, under the checkpoint format's embedding name (transformers drops lm_head)
    assert len(r["tied_keys"]) == 1 and r["tied_keys"][0].endswith("embed_tokens.weight"), r
    assert r["reloaded_tied"], r
    assert r["names"], r
    assert r["diff"] == 0.0, r
    assert r["control"] > 1e-3, r
    assert r["logits_diff"] <= 1e-6, r


def test_tied_pipeline_bf16_trains_the_same_function(launched):
    """bf16 with ZeRO 1 against fp32 with ZeRO 2 (pp2 tp2, same batches): losses within bf16
    rounding (2e-2), norms 5e-2, and the bf16 run's two copies equal to the bit."""
    results = launched["bf16"]
    for r in results:
        assert r["bf16"]["dtype"] == "torch.bfloat16" and r["fp32"]["dtype"] == "torch.float32"
        for got, want in zip(r["bf16"]["losses"], r["fp32"]["losses"]):
            assert abs(got - want) <= 2e-2 * abs(want), r
        for got, want in zip(r["bf16"]["norms"], r["fp32"]["norms"]):
            assert abs(got - want) <= 5e-2 * abs(want), r
    for run in ("bf16", "fp32"):
        copies = [r[run]["copy"] for r in results]
        assert all(c is not None for c in copies) and all(c == copies[0] for c in copies), run


def test_tied_pipeline_config_checks():
    """Accepted with ZeRO 0-2 (the pp refusal is gone); ZeRO 3 and optimizer offload refused by name."""
    from ds_hetero.config import load_config
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.toy import tiny_llava
    from ds_hetero.validation import check_all, check_tied_pipeline

    model = tiny_llava(text_layers=2, tie_word_embeddings=True)
    assert model.lm_head.weight is model.get_input_embeddings().weight

    def config(**zero):
        return load_config({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                            "zero_optimization": {"stage": 1, **zero},
                            "hetero_parallel": {"micro_batches": 2, "stages": {
                                "vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}}}, 4)

    check_all(config(), model)
    with pytest.raises(HeteroConfigError, match="ZeRO stage 3 with tied") as info:
        check_tied_pipeline(config(stage=3))
    assert "zero_optimization.stage" in str(info.value)
    with pytest.raises(HeteroConfigError, match="offload") as info:
        check_all(config(offload_optimizer={"device": "cpu"}), model)
    assert "zero_optimization.offload_optimizer" in str(info.value)
