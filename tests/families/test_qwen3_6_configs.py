"""Qwen3.6 and Qwen3.8 checkpoints are Qwen3.5's classes: their config.json says `"model_type": "qwen3_5"`
(`Qwen3_5ForConditionalGeneration`) or `"qwen3_5_moe"` (`Qwen3_5MoeForConditionalGeneration`), so the
registry's Qwen3.5 families take them as they are (docs/model-families.md, "Qwen3.6 and Qwen3.8").

The configs here are written by hand in the shape Qwen3.6-27B's config.json ships in (every field it carries,
the fields Qwen3.5's tiny model leaves at their defaults included: `mtp_num_hidden_layers`,
`output_gate_type`, `mamba_ssm_dtype`, `language_model_only`, the vision config's `model_type` "qwen3_5" and
empty `deepstack_visual_indexes`, interleaved M-RoPE over a quarter of each head with theta 1e7, three value
heads per key head), at tiny sizes; the MoE one as Qwen3.6-35B-A3B's (two value heads per key head). No
weights are read. Single process."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from ds_hetero.families import adapter_for, family_of, family_of_config


def _layer_types(n):
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


# Qwen3.6-27B's config.json (Qwen/Qwen3.6-27B), every field, at its own sizes
QWEN3_6_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "image_token_id": 248056, "language_model_only": False,
    "model_type": "qwen3_5", "tie_word_embeddings": False, "transformers_version": "4.57.1",
    "video_token_id": 248057, "vision_end_token_id": 248054, "vision_start_token_id": 248053,
    "text_config": {
        "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": 248044,
        "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 4, "head_dim": 256,
        "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17408,
        "layer_types": _layer_types(64), "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144, "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False, "num_attention_heads": 24,
        "num_hidden_layers": 64, "num_key_value_heads": 4, "output_gate_type": "swish", "pad_token_id": None,
        "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": 248320,
    },
    "vision_config": {
        "deepstack_visual_indexes": [], "depth": 27, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152,
        "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4304, "model_type": "qwen3_5",
        "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 5120, "patch_size": 16,
        "spatial_merge_size": 2, "temporal_patch_size": 2,
    },
}


def tiny_qwen3_6(moe: bool = False) -> dict:
    """QWEN3_6_27B's fields at tiny sizes (the tiny Qwen families' special ids; 300 tokens); with `moe`, the
    Qwen3.6-35B-A3B shape (every layer a MoE block with a shared expert, 2 value heads per key head)."""
    cfg = copy.deepcopy(QWEN3_6_27B)
    cfg.update(image_token_id=299, video_token_id=298, vision_start_token_id=297, vision_end_token_id=296)
    cfg["text_config"].update(
        bos_token_id=0, eos_token_id=1, head_dim=32, hidden_size=64, intermediate_size=128,
        layer_types=_layer_types(4), num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=6,
        vocab_size=300, max_position_embeddings=4096,
        # a quarter of each 32-wide head rotates: 8 dims, 4 frequencies, t/h/w 2/1/1, interleaved
        rope_parameters={"mrope_interleaved": True, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.25,
                         "rope_theta": 10000000, "rope_type": "default"})
    cfg["vision_config"].update(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, num_position_embeddings=16,
                                out_hidden_size=64, patch_size=4)
    if moe:
        cfg.update(architectures=["Qwen3_5MoeForConditionalGeneration"], model_type="qwen3_5_moe")
        text = cfg["text_config"]
        del text["intermediate_size"]
        text.update(model_type="qwen3_5_moe_text", linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=16, shared_expert_intermediate_size=32, router_aux_loss_coef=0.001,
                    output_router_logits=False)
        cfg["vision_config"]["model_type"] = "qwen3_5_moe"
    return cfg


def _write(tmp_path, name, cfg):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _ds_config(tmp_path, language):
    path = tmp_path / f"ds_{'_'.join(f'{k}{v}' for k, v in language.items())}.json"
    path.write_text(json.dumps({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                "hetero_parallel": {"micro_batches": 2, "stages": {"vision": {"dp": 4},
                                                                                   "language": language}}}))
    return str(path)


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3.6-dense", "qwen3.6-moe"])
def test_qwen3_6_config_is_recognized_validated_and_planned(moe, tmp_path, capsys):
    from ds_hetero.cli import main
    from ds_hetero.planner.model_source import load_hf_config, meta_model
    from ds_hetero.planner.model_spec import model_spec

    name = "qwen3.5-moe" if moe else "qwen3.5"
    d = _write(tmp_path, "ckpt", tiny_qwen3_6(moe))
    config = load_hf_config(str(d))  # AutoConfig of the directory, as --model DIR reads it
    assert family_of_config(config).name == name
    model = meta_model(config)
    assert type(model).__name__ == ("Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration")
    assert family_of(model).name == name

    language = {"tp": 2, "dp": 2, **({"ep": 2} if moe else {})}
    assert main(["validate", _ds_config(tmp_path, language), "--world-size", "4", "--model", str(d)]) == 0
    assert "valid for 4 ranks" in capsys.readouterr().out
    # the config's own head counts are read: tp 4 does not divide its 6 (dense) / 4 (MoE) value heads' key heads
    bad = main(["validate", _ds_config(tmp_path, {"tp": 4, "dp": 1}), "--world-size", "4", "--model", str(d / "config.json")])
    err = capsys.readouterr()
    assert bad != 0 and "linear-attention" in err.out + err.err, err

    out = tmp_path / "planned.json"
    assert main(["plan", "--model", str(d), "--world-size", "4", "--seq-len", "64", "--image-tokens", "16",
                 "--global-batch", "8", "--machine", "h100", "--top", "3", "--write", str(out)]) == 0
    assert json.loads(out.read_text())["hetero_parallel"]["stages"]["language"]  # the plan's pick, written
    spec, stages = model_spec(config), adapter_for(model).split()
    for stage in ("vision", "language"):
        assert spec.stage_params(stage) == sum(p.numel() for p in stages[stage].parameters()), stage


def test_qwen3_6_27b_config_as_shipped_plans_and_validates_by_its_heads(tmp_path, capsys):
    """The full-size config: built on meta, counted exactly by the planner, valid at language tp 4 (16 key /
    48 value linear heads, 24 / 4 attention heads) and refused at tp 8 (4 kv heads), naming the field."""
    from ds_hetero.cli import main
    from ds_hetero.planner.model_source import load_hf_config, meta_model
    from ds_hetero.planner.model_spec import model_spec

    d = _write(tmp_path, "Qwen3.6-27B", QWEN3_6_27B)
    config = load_hf_config(str(d))
    model = meta_model(config)
    assert family_of_config(config).name == family_of(model).name == "qwen3.5"
    spec, stages = model_spec(config), adapter_for(model).split()
    for stage in ("vision", "language"):
        assert spec.stage_params(stage) == sum(p.numel() for p in stages[stage].parameters()), stage
    assert round(spec.params() / 1e9, 1) == 27.4  # without the MTP layer (its tensors are not loaded)
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"train_batch_size": 16, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                              "hetero_parallel": {"micro_batches": 2, "stages": {"vision": {"dp": 8},
                                                                                 "language": {"tp": 4, "dp": 2}}}}))
    assert main(["validate", str(ok), "--world-size", "8", "--model", str(d)]) == 0
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    bad.write_text(ok.read_text().replace('"tp": 4, "dp": 2', '"tp": 8, "dp": 1'))
    assert main(["validate", str(bad), "--world-size", "8", "--model", str(d)]) != 0
    err = capsys.readouterr()
    assert "hetero_parallel.stages.language.tp" in err.out + err.err, err


# the YaRN block the Qwen3.8 model card gives for contexts past 262,144 tokens (factor 4 over the native
# length), here over a tiny native length: the same fields in Qwen3.5's classes
YARN = {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "yarn", "rope_theta": 10000000,
        "partial_rotary_factor": 0.25, "factor": 4.0, "original_max_position_embeddings": 1024}


@pytest.mark.parametrize("rope", ["as shipped", "yarn"])
def test_qwen3_6_split_equals_fused_with_three_value_heads_per_key_head(rope):
    """The tiny Qwen3.6 built from its config (float64, seeded): the stages give the fused model's logits and
    every parameter gradient, with images and without (0.25 partial rotary, interleaved M-RoPE, 3 value heads
    per key head); also with the YaRN rope parameters of the Qwen3.8 card's long-context setting."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from ds_hetero.families.qwen3_5.adapter import Qwen3_5Adapter
    from ds_hetero.testing.batches import qwen_samples, token_loss_sum

    cfg = tiny_qwen3_6()
    if rope == "yarn":
        cfg["text_config"]["rope_parameters"] = dict(YARN)
    config = AutoConfig.for_model(**cfg)
    assert config.text_config.rope_parameters["rope_type"] == ("yarn" if rope == "yarn" else "default")
    with torch.random.fork_rng():
        torch.manual_seed(3)
        model = AutoModelForImageTextToText.from_config(config).double()
    assert model.model.language_model.rotary_emb.rope_type == config.text_config.rope_parameters["rope_type"]
    adapter = adapter_for(model)
    assert isinstance(adapter, Qwen3_5Adapter)
    samples = qwen_samples(model, [(1, 8, 8), None, (1, 4, 8)])
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    batch, vision = adapter.language_inputs(samples), adapter.vision_inputs(samples)
    fused = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  pixel_values=vision["pixel_values"].double(), image_grid_thw=vision["image_grid_thw"],
                  mm_token_type_ids=(batch["input_ids"] == model.config.image_token_id).int()).logits
    token_loss_sum(fused, batch["labels"]).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    stages = adapter.split()
    rows = stages["vision"](pixel_values=vision["pixel_values"].double(), image_grid_thw=vision["image_grid_thw"])
    logits = stages["language"](batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    mask = batch["attention_mask"].bool()
    assert float((logits[mask] - fused[mask]).detach().abs().max()) < 1e-12
    token_loss_sum(logits, batch["labels"]).backward()
    for n, p in model.named_parameters():
        assert float((p.grad - want[n]).abs().max()) < 1e-12, n
