"""The Hugging Face releases ds_hetero runs on, and the few internals that differ between them.

ds_hetero is tested on two pinned sets (.ci/setup, `DS_HETERO_PINS=low`):

    newest    transformers 5.23, accelerate 1.15, trl 1.16, peft 0.21  (the bounds' upper ends)
    low       transformers 5.13, accelerate 1.11, trl 0.29, peft 0.20  (the floors; ms-swift 4.6 installs beside it)

The floors, each set by a private internal ds_hetero relies on:

    transformers >= 5.13   Gemma 3's `create_masks_for_vision_model` and `get_block_sequence_ids_for_mask`
                           (models/gemma3.py builds the language stage's bidirectional image-block mask with
                           them) appear in 5.13; 5.10-5.12 have neither, 5.0-5.6 an older mask API.
                           `Trainer._wrap_model`, the attention registry (`AttentionInterface`,
                           `ALL_ATTENTION_FUNCTIONS.get_interface`), `core_model_loading` and
                           `conversion_mapping` (per-shard loading) are the same from 5.13 on.
    accelerate >= 1.11     what transformers 5.13's Trainer imports from it; the DeepSpeed plugin's
                           `deepspeed_config` and the `gradient_accumulation_steps` it inserts are the same.
    trl >= 0.29            the newest release ms-swift 4.6 accepts (trl < 1.0); `SFTTrainer._metrics`,
                           `_total_train_tokens` and the `loss_type` / `padding_free` fields are there.
    peft >= 0.20           ms-swift 4.6 requires peft < 0.21; `LoraLayer.lora_A/lora_B/lora_dropout`, and
                           `get_peft_model_state_dict` are the same as in 0.21.

What differs inside that range, and where it is handled (here, so each caller stays version-blind):

    Qwen2.5-Omni thinker   transformers 5.23 moved the encoders and the text model under a new
                           `Qwen2_5OmniThinkerModel` (`thinker.model.{visual, audio_tower, language_model}`);
                           up to 5.22 they sit on the thinker itself (`thinker.{visual, audio_tower}`,
                           `thinker.model` is the text model). `omni_parts` reads either; parameter names
                           follow (`visual.*` at the top before 5.23, `model.visual.*` from 5.23).
    TRL's `entropy`        TRL 1.x averages it over the label tokens of every rank (as ds_hetero's loss pass
                           counts it, integrations/trainer/token_metrics.py); TRL < 1.0 over every non-padding
                           token, per rank, then the mean of the ranks' means. Under trl 0.29 ds_hetero logs
                           the label-token entropy: 1.0e-5 relative from stock on the tiny LLaVA
                           (tests/clients/test_trl_recipe.py allows 5e-5 there; loss, accuracy and grad norm match).
    Qwen2.5-Omni processor before 5.23 reads `video_processor.merge_size` even for a batch without videos;
                           only the tests' locally built processor (no torchvision, so no video processor)
                           meets it (tests/helpers/family_processors.py gives it the image merge size).
    Qwen2-VL patchify      `Qwen2VLImageProcessor.patchify` exists from 5.15 (inline in the processor
                           before); only tests/families/test_data_shapes.py compiles it from the installed source, and
                           skips below 5.15 (the processor's own output is checked there on every version).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # `import ds_hetero` reads the floor below without importing torch
    import torch.nn as nn

TRANSFORMERS_FLOOR = "5.13.0"


def check_transformers(installed: str | None = None) -> None:
    """At `import ds_hetero`: an installed transformers below the floor (forced past setup.cfg's bound,
    e.g. `pip install --no-deps`) is an ImportError naming both versions, not a crash deep in a model."""
    from packaging.version import Version

    if installed is None:  # the installed distribution's version, without importing transformers (seconds)
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("transformers")
        except PackageNotFoundError:
            raise ImportError(f"ds_hetero needs transformers >= {TRANSFORMERS_FLOOR}, which is not installed; "
                              f"pip install 'transformers>={TRANSFORMERS_FLOOR},<5.24'") from None
    if Version(installed) < Version(TRANSFORMERS_FLOOR):
        raise ImportError(
            f"ds_hetero needs transformers >= {TRANSFORMERS_FLOOR} (found {installed}): the internals it builds "
            f"the model families' stages on (ds_hetero/versions.py) are missing before it; "
            f"pip install 'transformers>={TRANSFORMERS_FLOOR},<5.24'")


class OmniParts(NamedTuple):
    visual: nn.Module
    audio_tower: nn.Module
    language_model: nn.Module
    rope: nn.Module  # the module whose `get_rope_index` computes the TMRoPE positions


def omni_parts(thinker: nn.Module) -> OmniParts:
    """The Qwen2.5-Omni thinker's vision and audio encoders, text model, and rope owner, in either layout."""
    inner = thinker.model
    if hasattr(inner, "language_model"):  # transformers >= 5.23: Qwen2_5OmniThinkerModel
        return OmniParts(inner.visual, inner.audio_tower, inner.language_model, inner)
    return OmniParts(thinker.visual, thinker.audio_tower, inner, thinker)  # <= 5.22: the thinker holds them
