"""`ds-hetero validate` and `initialize` share one set of checks: no config is valid for one only.

Each configuration below was once called valid by `validate` and then refused by `initialize`.
`initialize` raises these before any process group exists (the launcher's WORLD_SIZE is all it
needs), so a single process checks both sides: the same HeteroConfigError, naming the same field.
The valid base config is the positive control (validate accepts it, with and without --model).
"""

import copy
import json

import pytest

from ds_hetero.cli import main
from ds_hetero.errors import HeteroConfigError

WORLD = 4
BASE = {
    "train_batch_size": 8, "zero_optimization": {"stage": 1}, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "hetero_parallel": {"micro_batches": 2, "stages": {"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}},
}


def _with(**changes):
    cfg = copy.deepcopy(BASE)
    for key, value in changes.items():
        if key == "stages":
            cfg["hetero_parallel"]["stages"] = value
        elif key == "placement":
            cfg["hetero_parallel"]["placement"] = value
        elif value is None:
            cfg.pop(key)
        else:
            cfg[key] = value
    return cfg


REFUSED = {
    "fp16": (_with(fp16={"enabled": True}), "fp16.enabled"),
    "bf16 with zero 0": (_with(bf16={"enabled": True}, zero_optimization={"stage": 0}), "zero_optimization.stage"),
    "zero 3 disaggregated": (_with(zero_optimization={"stage": 3}, placement="disaggregated",
                                   stages={"vision": {"dp": 2}, "language": {"tp": 2, "dp": 1}}),
                             "zero_optimization.stage"),
    "zero 3 with language cp 2 without reduce-scatter": (
        _with(zero_optimization={"stage": 3, "reduce_scatter": False},
              stages={"vision": {"dp": 4}, "language": {"cp": 2, "dp": 2}}), "zero_optimization.reduce_scatter"),
    "language zero_stage 3 disaggregated": (_with(placement="disaggregated", stages={
        "vision": {"dp": 2}, "language": {"tp": 2, "dp": 1, "zero_stage": 3}}),
        "hetero_parallel.stages.language.zero_stage"),
    "every stage frozen": (_with(stages={"vision": {"dp": 4, "freeze": True},
                                         "language": {"tp": 2, "dp": 2, "freeze": True}}),
                           "hetero_parallel.stages.language.freeze"),

    "audio stage": (_with(stages={"vision": {"dp": 4}, "audio": {"dp": 4}, "language": {"tp": 2, "dp": 2}}),
                    "hetero_parallel.stages.audio"),
    "no optimizer": (_with(optimizer=None), "optimizer"),
    "negative clipping": (_with(gradient_clipping=-1.0), "gradient_clipping"),
    "non-numeric clipping": (_with(gradient_clipping="abc"), "gradient_clipping"),
}


# An audio stage is valid for a model with an audio encoder (Qwen2.5-Omni): whether it is refused
# depends on the model, so `validate` is given the model `initialize` gets.
VALIDATE_WITH_MODEL = {"audio stage": ("--model", "tiny-llava")}


def _validate(tmp_path, cfg, capsys, *extra):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    code = main(["validate", str(path), "--world-size", str(WORLD), *extra])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def model():
    from ds_hetero.toy import tiny_llava

    return tiny_llava("clip")


@pytest.mark.parametrize("name", list(REFUSED))
def test_validate_and_initialize_refuse_alike(name, tmp_path, capsys, monkeypatch, model):
    import torch.distributed as dist

    import ds_hetero

    cfg, field = REFUSED[name]
    code, err = _validate(tmp_path, cfg, capsys, *VALIDATE_WITH_MODEL.get(name, ()))
    assert code == 1 and f"'{field}'" in err, (name, err)
    monkeypatch.setenv("WORLD_SIZE", str(WORLD))
    with pytest.raises(HeteroConfigError) as info:
        ds_hetero.initialize(model, cfg)
    assert info.value.field == field, (name, str(info.value))
    assert not dist.is_initialized()  # refused before any process group


def test_the_base_config_is_valid_with_and_without_the_model(tmp_path, capsys):
    assert _validate(tmp_path, BASE, capsys)[0] == 0
    assert _validate(tmp_path, BASE, capsys, "--model", "tiny-llava")[0] == 0


def test_validate_model_checks_heads_and_vocabulary(tmp_path, capsys, model):
    # tiny-llava has 2 kv heads: tp 4 cannot split them; initialize says the same
    tp4 = _with(stages={"vision": {"dp": 4}, "language": {"tp": 4, "dp": 1}})
    code, err = _validate(tmp_path, tp4, capsys, "--model", "tiny-llava")
    assert code == 1 and "key/value heads" in err, err
    assert _validate(tmp_path, tp4, capsys)[0] == 0  # without the model the layout alone is fine
    # a checkpoint directory (config.json only: no weights are read) with a vocabulary tp 2 cannot split
    from ds_hetero.toy import tiny_llava

    tiny_llava("clip", vocab=255).config.save_pretrained(tmp_path / "ckpt")
    code, err = _validate(tmp_path, BASE, capsys, "--model", str(tmp_path / "ckpt"))
    assert code == 1 and "vocabulary (255)" in err, err
    # advice a user of initialize can follow (there is no pad_vocab knob in the engine)
    assert "pad_vocab" not in err and "resize_token_embeddings(255, pad_to_multiple_of=2)" in err, err
    code, err = _validate(tmp_path, BASE, capsys, "--model", str(tmp_path / "nowhere"))
    assert code == 1 and "'--model'" in err, err


def test_client_optimizer_flag_matches_initialize_with_an_optimizer(tmp_path, capsys):
    no_opt = _with(optimizer=None)
    assert _validate(tmp_path, no_opt, capsys, "--client-optimizer")[0] == 0
