"""Adding a model family is its home (adapter, tp plans, tiny model, sample format in one record) plus one
registry line: a toy family built here the way families/<family>/ are, registered by extending FAMILIES,
is found for its model and its config, shards by its own plans, and passes initialize's checks; without
its registry line its projector has no tp plan and the same checks refuse it (the negative control)."""

import pytest
import torch
from transformers import LlavaConfig, LlavaForConditionalGeneration
from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

from ds_hetero import load_config
from ds_hetero.errors import HeteroConfigError
from ds_hetero.families import FAMILIES, Family, adapter_for, family_of, family_of_config, known_encoder_stages
from ds_hetero.families.llava.adapter import LlavaAdapter
from ds_hetero.families.llava.sample_format import shapes_samples as llava_samples
from ds_hetero.tensor_parallel.shard_plans import ShardPlan
from ds_hetero.toy import ShapesCaptionDataset, Vocabulary, tiny_llava
from ds_hetero.validation import check_all


# ---- the toy family's home: what families/toy_vlm/{adapter,plans,tiny,samples}.py would hold --------------
class ToyVLMConfig(LlavaConfig):
    model_type = "toy_vlm"


class ToyProjector(LlavaMultiModalProjector):
    """A projector class no built-in family has a tp plan for."""


class ToyVLMForConditionalGeneration(LlavaForConditionalGeneration):
    config_class = ToyVLMConfig


class ToyVLMAdapter(LlavaAdapter):
    """The toy family's adapter: it splits the model as LLaVA does (as LLaVA-OneVision reuses LLaVA's
    vision stage)."""


TOY_PLANS = {f"{__name__}:ToyProjector": ShardPlan(column=("linear_1",), row=("linear_2",))}


def tiny_toy_vlm(seed: int = 0) -> torch.nn.Module:
    base = tiny_llava("clip", seed=seed)
    model = ToyVLMForConditionalGeneration.__new__(ToyVLMForConditionalGeneration)
    model.__dict__.update(base.__dict__)
    fields = {k: v for k, v in base.config.to_dict().items() if k != "model_type"}
    model.config = ToyVLMConfig(**fields)
    model.model.multi_modal_projector.__class__ = ToyProjector
    return model


TOY = Family("toy-vlm", model_classes=("ToyVLMForConditionalGeneration",), model_types=("toy_vlm",),
             adapter=ToyVLMAdapter, tiny=tiny_toy_vlm, tp_plans=TOY_PLANS, shapes_samples=llava_samples)
REGISTRY = (*FAMILIES, TOY)  # the one registry line
# ----------------------------------------------------------------------------------------------------------


def _cfg(vision_tp: int):
    ds = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "hetero_parallel": {"stages": {"vision": {"tp": vision_tp, "dp": 4 // vision_tp},
                                         "language": {"tp": 2, "dp": 2}}}}
    return load_config(ds, 4)


def test_the_registry_finds_the_new_family_for_its_model_and_config():
    model = TOY.tiny(seed=0)
    assert family_of(model, REGISTRY) is TOY
    assert family_of_config(model.config, REGISTRY) is TOY
    adapter = adapter_for(model, REGISTRY)
    assert type(adapter) is ToyVLMAdapter and f"{__name__}:ToyProjector" in adapter.tp_plans
    assert known_encoder_stages(REGISTRY) == known_encoder_stages()  # its stages are LLaVA's
    assert TOY.tiny_name == "tiny-toy-vlm"


def test_its_sample_format_builds_its_data():
    model = TOY.tiny(seed=0)
    spec = TOY.shapes_samples(model.config)
    data = ShapesCaptionDataset(4, seed=0, vocab=Vocabulary(**spec.pop("vocab")), **spec)
    sample = data[0]
    assert int((sample["input_ids"] == model.config.image_token_id).sum()) == sample["pixel_values"].shape[0] * 16


def test_initialize_checks_pass_with_its_home_and_refuse_without_it():
    model = TOY.tiny(seed=0)
    check_all(_cfg(vision_tp=2), model, adapter=adapter_for(model, REGISTRY))  # the toy plans shard its projector
    # negative control: the registry without the toy's line finds LLaVA's adapter (the toy model is a LLaVA
    # subclass) and LLaVA's plans, which do not cover ToyProjector
    with pytest.raises(HeteroConfigError, match="no tensor-parallel plan matches any module of ToyProjector"):
        check_all(_cfg(vision_tp=2), model, adapter=adapter_for(model, FAMILIES))
