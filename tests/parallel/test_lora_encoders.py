"""The LoRA layout check covers every encoder stage, each with its own tp (pure: no processes).

The Qwen2.5-Omni thinker has two encoders; a LoRA layer in its audio encoder is judged by the
audio stage's tp, one in its vision tower by the vision stage's, the rest by the language's.
"""

import pytest
import torch

from ds_hetero.config import parse_config
from ds_hetero.errors import HeteroConfigError
from ds_hetero.families import adapter_for
from ds_hetero.toy import tiny_qwen2_5_omni
from ds_hetero.tensor_parallel.lora_checks import check_lora, lora_problems


def cfg(vision_tp=1, audio_tp=1, language_tp=1):
    stages = {"vision": {"tp": vision_tp, "dp": 4 // vision_tp}, "audio": {"tp": audio_tp, "dp": 4 // audio_tp},
              "language": {"tp": language_tp, "dp": 4 // language_tp}}
    return parse_config({"train_batch_size": 8, "hetero_parallel": {"stages": stages}}, 4)


def peft(**kw):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    return get_peft_model(tiny_qwen2_5_omni(seed=0), LoraConfig(r=2, **kw)).get_base_model()


def test_audio_lora_layer_judged_by_the_audio_tp():
    # `proj` after the audio tower's pooling is not sharded by the audio tp plan; the only
    # module of that name is in the audio encoder.
    proj = peft(target_modules=r".*audio_tower\.proj")
    check_lora(proj, adapter_for(proj), cfg(vision_tp=2, audio_tp=1, language_tp=2))  # audio tp 1: any module
    with pytest.raises(HeteroConfigError, match=r"audio_tower\.proj: a LoRA layer on a module tensor parallelism "
                                                r"does not shard, in the audio stage with tp=2"):
        check_lora(proj, adapter_for(proj), cfg(audio_tp=2))


def test_dropout_accepted_at_any_encoder_tp():
    """lora_dropout > 0 trains at any tp of every stage (its mask from the stage's RNG: test_lora_dropout.py)."""
    drop = peft(target_modules=["fc1", r"q"], lora_dropout=0.1)  # audio fc1 and the vision attention's q
    check_lora(drop, adapter_for(drop), cfg(vision_tp=2, audio_tp=2, language_tp=2))


def test_every_layer_gets_its_own_stage():
    # q/k/v of both towers and the decoder, sharded in every stage: no problem at any tp ...
    model = peft(target_modules=["q_proj", "k_proj", "v_proj", "q", "k", "v", "fc2", "down_proj"])
    adapter = adapter_for(model)
    check_lora(model, adapter, cfg(2, 2, 2))
    # ... and, with an unsharded target in each stage, each is named once, with its own stage.
    model = peft(target_modules=r".*(audio_tower\.proj|lm_head|patch_embed\.proj)")
    problems = lora_problems(model, adapter_for(model).encoder_modules(), {"vision": 2, "audio": 2, "language": 2},
                             plans=adapter_for(model).tp_plans)
    assert any("audio_tower.proj" in p and "audio stage with tp=2" in p for p in problems), problems
    assert any("lm_head" in p and "language stage with tp=2" in p for p in problems), problems
    assert any("patch_embed.proj" in p and "vision stage with tp=2" in p for p in problems), problems
    assert len(problems) == 3 and len(problems) == len({p.split(":")[0] for p in problems})
