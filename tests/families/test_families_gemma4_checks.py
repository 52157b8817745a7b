"""Gemma 4 without processes: the refusals `ds-hetero validate` shares with `initialize` (cp, sequence
parallelism, bidirectional "all", packed rows scored whole; packed per sample and every pp cut are accepted), the sample checks by field, the stage split against the
fused model (with a negative control), and the planner's shapes. The distributed parity is
test_families_gemma4.py."""

import pytest
import torch

pytest.importorskip("transformers.models.gemma4")  # not in every pinned transformers

BASE = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def _check(stages, world=4, packed=False, **more):
    from ds_hetero.config import load_config
    from ds_hetero.toy import tiny_gemma4
    from ds_hetero.validation import check_model

    hetero = {"micro_batches": 2, "stages": stages, **more}
    if packed:
        hetero["language_batching"] = "packed"
    check_model(load_config({**BASE, "hetero_parallel": hetero}, world), tiny_gemma4())


@pytest.mark.parametrize("language, field", [
    ({"cp": 2, "dp": 2}, "cp"), ({"tp": 2, "dp": 2, "sequence_parallel": True}, "sequence_parallel")])
def test_validate_refuses_sequence_shards(language, field):
    from ds_hetero.errors import HeteroConfigError

    with pytest.raises(HeteroConfigError) as exc:
        _check({"vision": {"dp": 4}, "audio": {"dp": 4}, "language": language})
    assert exc.value.field == f"hetero_parallel.stages.language.{field}", exc.value


@pytest.mark.parametrize("language", [{"dp": 2, "pp": 2}, {"tp": 2, "dp": 1, "pp": 2, "pp_layers": [1, 3]},
                                      {"dp": 1, "pp": 4}])
def test_validate_takes_any_pipeline_cut(language):
    """Every cut is accepted: what crosses it travels with the hidden states (pipeline_carry.py)."""
    _check({"vision": {"dp": 4}, "audio": {"dp": 4}, "language": language})


def test_validate_takes_tp2_and_ep2_and_names_a_missing_audio_stage():
    from ds_hetero.errors import HeteroConfigError

    _check({"vision": {"tp": 2, "dp": 2}, "audio": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}})
    with pytest.raises(HeteroConfigError) as exc:
        _check({"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}})
    assert exc.value.field == "hetero_parallel.stages.audio", exc.value
    with pytest.raises(HeteroConfigError) as exc:  # the dense model has no experts
        _check({"vision": {"dp": 4}, "audio": {"dp": 4}, "language": {"dp": 4, "ep": 2}})
    assert exc.value.field == "hetero_parallel.stages.language.ep", exc.value
    with pytest.raises(HeteroConfigError) as exc:  # 3 heads per rank would not divide the 2 kv heads
        _check({"vision": {"dp": 8}, "audio": {"dp": 8}, "language": {"tp": 4, "dp": 2}}, world=8)
    assert exc.value.field == "hetero_parallel.stages.language.tp", exc.value


def test_validate_takes_packing_per_sample_and_refuses_a_whole_row_mask_and_bidirectional_all():
    from ds_hetero.config import load_config
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.toy import tiny_gemma4
    from ds_hetero.validation import check_model

    stages = {"vision": {"dp": 4}, "audio": {"dp": 4}, "language": {"dp": 4}}
    _check(stages, packed=True)  # each sample under its own masks (test_gemma_packed_rows.py)
    with pytest.raises(HeteroConfigError, match="per-sample attention only") as exc:
        _check(stages, packed=True, packed_attention="row_mask")
    assert exc.value.field == "hetero_parallel.packed_attention"
    model = tiny_gemma4()
    model.config.text_config.use_bidirectional_attention = "all"
    cfg = load_config({**BASE, "hetero_parallel": {"micro_batches": 2, "stages": {
        "vision": {"dp": 4}, "audio": {"dp": 4}, "language": {"dp": 4}}}}, 4)
    with pytest.raises(HeteroConfigError, match="use_bidirectional_attention"):
        check_model(cfg, model)


def test_samples_are_checked_by_field():
    from ds_hetero.families import adapter_for
    from ds_hetero.toy import tiny_gemma4
    from tests.helpers.gemma4_data import SPECS, gemma4_samples

    model = tiny_gemma4()
    adapter = adapter_for(model)
    samples = gemma4_samples(model, SPECS)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    positions = samples[0]["image_position_ids"].clone()
    positions[:, 4:] = -1  # 4 real patches: one soft token, not the 4 the placeholders hold
    bad = dict(samples[0], image_position_ids=positions)
    with pytest.raises(ValueError, match="image placeholder runs"):
        adapter.check_sample(bad, 0)
    bad = dict(samples[3], input_features_mask=samples[3]["input_features_mask"].flip(-1))  # padding first
    with pytest.raises(ValueError, match="prefix"):
        adapter.check_sample(bad, 0)
    bad = {k: v for k, v in samples[3].items() if k != "input_features_mask"}
    with pytest.raises(ValueError, match="input_features_mask"):
        adapter.check_sample(bad, 0)
    bad = dict(samples[1], pixel_values_videos=torch.zeros(1, 16, 48))
    with pytest.raises(ValueError, match="pixel_values_videos"):
        adapter.check_sample(bad, 0)


def test_the_split_equals_the_fused_model_and_the_negative_control_differs():
    """The stages (vision, audio, language) give the fused model's loss and every parameter's gradient
    (fp32: the audio tower computes its attention in fp32 whatever the model's dtype), dense and MoE; the
    fused model without mm_token_type_ids (image blocks causal) gives another loss."""
    import copy

    import torch.nn.functional as F

    from ds_hetero.families import adapter_for
    from ds_hetero.toy import tiny_gemma4
    from tests.helpers.gemma4_data import SPECS, gemma4_reference_loss, gemma4_samples

    for moe in (False, True):
        model = tiny_gemma4(seed=3, moe=moe)
        fused = copy.deepcopy(model)
        adapter = adapter_for(model)
        samples = gemma4_samples(model, SPECS, seed=1)
        stages = adapter.split()
        batch = adapter.language_inputs(samples)
        rows = [stages[n](**port.inputs(samples)) for n, port in adapter.encoders().items()]
        logits = stages["language"](batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100)
        ref = gemma4_reference_loss(fused, adapter_for(fused), samples)
        with torch.no_grad():
            wrong = gemma4_reference_loss(fused, adapter_for(fused), samples, wrong=True)
        assert abs(float(loss) - float(ref)) <= 1e-6 * abs(float(ref)), (moe, float(loss), float(ref))
        assert abs(float(wrong) - float(ref)) > 1e-5 * abs(float(ref)), (moe, float(wrong), float(ref))
        loss.backward()
        ref.backward()
        want = dict(fused.named_parameters())
        for name, p in model.named_parameters():
            assert p.grad is not None and want[name].grad is not None, name
            torch.testing.assert_close(p.grad, want[name].grad, rtol=1e-5, atol=1e-7, msg=name)


def test_planner_shapes_count_the_parameters_and_plan_runs(tmp_path, capsys):
    """The planner's reader counts every stage's parameters exactly (dense and MoE); `ds-hetero validate`
    and `ds-hetero plan` take tiny-gemma4."""
    import json
    import pathlib

    from ds_hetero.cli import main
    from ds_hetero.families import adapter_for
    from ds_hetero.planner.model_spec import model_spec
    from ds_hetero.toy import tiny_gemma4

    for moe in (False, True):
        model = tiny_gemma4(moe=moe)
        spec, stages = model_spec(model.config), adapter_for(model).split()
        for name in ("vision", "audio"):
            assert spec.encoder(name).params() == sum(p.numel() for p in stages[name].parameters()), (moe, name)
        assert spec.language.params() == sum(p.numel() for p in stages["language"].parameters()), moe
    root = pathlib.Path(__file__).resolve().parents[2]
    assert main(["validate", str(root / "ds_configs/gemma4_colocated.json"), "--world-size", "4",
                 "--model", "tiny-gemma4"]) == 0
    assert "valid for 4 ranks" in capsys.readouterr().out
    out = tmp_path / "planned.json"
    assert main(["plan", "--model", "tiny-gemma4", "--world-size", "4", "--seq-len", "64", "--image-tokens", "4",
                 "--rows", "audio=8", "--global-batch", "8", "--machine", "h100", "--top", "3",
                 "--write", str(out)]) == 0
    language = json.loads(out.read_text())["hetero_parallel"]["stages"]["language"]
    assert language.get("cp", 1) == 1 and not language.get("sequence_parallel", False)  # only what the adapter takes
