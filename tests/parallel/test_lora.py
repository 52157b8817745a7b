"""LoRA (PEFT) under three layouts against a single-process PEFT reference (tests/helpers/lora_driver.py, one launch
of 4 CPU ranks): tiny LLaVA with adapters on every attention and MLP linear of the tower and the decoder
(B initialised non-zero, so A's gradients are exercised from step 1), fp32.

    colocated  vision dp4,     language tp2 dp2
    colocated  vision tp2 dp2, language tp4        (LoRA split with the tower's and decoder's tp)
    disaggregated vision dp2 (ranks 0-1), language tp2 (ranks 2-3)

Losses and all-stage grad norms equal the reference's (whose losses are HF's own `model(**batch).loss`);
the adapter `save_peft_adapter` wrote loads with `PeftModel.from_pretrained` and equals the reference's
trained LoRA weights (1e-5 per tensor); only LoRA weights are trainable and in the optimizers.
Negative control: the untrained adapter differs from the trained reference far above the tolerance.
Pure: the layouts LoRA cannot train exactly are refused by name (lora_dropout > 0 is not one of them).
"""

import os

import pytest

from tests.helpers.driver_report import launch_driver

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYOUTS = ["v_dp4__l_tp2dp2", "v_tp2dp2__l_tp4", "disagg_v_dp2__l_tp2"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launch_driver(ROOT, "lora_driver.py", tmp_path_factory.mktemp("lora"), timeout=900)


@pytest.mark.distributed
@pytest.mark.parametrize("layout", LAYOUTS)
def test_lora_matches_single_process_peft(ranks, layout):
    r0 = ranks[0][layout]
    assert r0["ref_losses"] == pytest.approx(r0["hf_losses"], rel=1e-6)  # the reference is HF's own loss
    for r in ranks:
        assert r[layout]["losses"] == pytest.approx(r0["ref_losses"], rel=1e-5)
        assert r[layout]["grad_norms"] == pytest.approx(r0["ref_norms"], rel=1e-5)
        assert r[layout]["only_lora_trainable"]
        for stage, n in r[layout]["in_optimizer"].items():  # ZeRO-1: each dp rank holds 1/dp of them
            assert n * r[layout]["dp"][stage] == r[layout]["trainable"][stage] > 0
    worst, _, got_n, want_n = r0["adapter_err"]
    assert got_n == want_n == 52  # every A and B of 26 LoRA layers came back from the saved adapter
    assert worst < 1e-5
    assert r0["moved_err"] > 100 * 1e-5  # negative control: the untrained adapter is far from the trained one
    assert "adapter_model.safetensors" in r0["files"] and "adapter_config.json" in r0["files"]


def test_lora_layouts_refused_by_name():
    import torch
    from peft import LoraConfig, get_peft_model

    from ds_hetero.config import parse_config
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.families import adapter_for
    from ds_hetero.toy import tiny_llava
    from ds_hetero.tensor_parallel.lora_checks import check_lora

    def cfg(vision_tp, language_tp, sp=False):
        language = {"tp": language_tp, "dp": 4 // language_tp, **({"sequence_parallel": True} if sp else {})}
        return parse_config({"train_batch_size": 8, "hetero_parallel": {"stages": {
            "vision": {"tp": vision_tp, "dp": 4 // vision_tp}, "language": language}}}, 4)

    def peft(**kw):
        torch.manual_seed(0)
        return get_peft_model(tiny_llava("clip", seed=0), LoraConfig(r=2, **kw)).get_base_model()

    ok = peft(target_modules=["q_proj", "down_proj"])
    check_lora(ok, adapter_for(ok), cfg(2, 2))
    head = peft(target_modules=["q_proj", "lm_head"])
    check_lora(head, adapter_for(head), cfg(1, 1))  # tp 1: any module
    with pytest.raises(HeteroConfigError, match="lm_head: a LoRA layer on a module tensor parallelism does not shard"):
        check_lora(head, adapter_for(head), cfg(1, 2))
    drop = peft(target_modules=["fc1", "q_proj"], lora_dropout=0.1)
    check_lora(drop, adapter_for(drop), cfg(2, 2))  # dropout at tp > 1: the stage's RNG (tests/parallel/test_lora_dropout.py)
    with pytest.raises(HeteroConfigError, match="sequence parallelism"):
        check_lora(ok, adapter_for(ok), cfg(1, 2, sp=True))
    dora = peft(target_modules=["q_proj"], use_dora=True)
    with pytest.raises(HeteroConfigError, match="DoRA"):
        check_lora(dora, adapter_for(dora), cfg(1, 1))
