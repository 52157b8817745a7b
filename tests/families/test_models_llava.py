"""The two-stage LLaVA split reproduces the fused model."""

import pytest
import torch

from ds_hetero.families.llava.adapter import split_llava
from ds_hetero.toy import tiny_llava
from ds_hetero.testing.batches import collate, llava_samples, token_loss_sum


@pytest.mark.parametrize("vision", ["clip", "siglip"])
def test_split_logits_and_grads_equal_fused(vision):
    model = tiny_llava(vision, seed=1).double()
    batch = collate(llava_samples(model, 3))
    fused = model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"].double()).logits
    token_loss_sum(fused, batch["labels"]).backward()
    fused_grads = {n: p.grad for n, p in model.named_parameters()}  # None where unused (CLIP's last layer)
    model.zero_grad(set_to_none=True)

    stages = split_llava(model)
    rows = stages["vision"](batch["pixel_values"].double())
    assert rows.shape == (3 * 16, model.config.text_config.hidden_size)
    logits = stages["language"](batch["input_ids"], rows)
    torch.testing.assert_close(logits, fused, rtol=0, atol=1e-12)
    token_loss_sum(logits, batch["labels"]).backward()
    for name, p in model.named_parameters():
        if fused_grads[name] is None:
            assert p.grad is None, name
        else:
            torch.testing.assert_close(p.grad, fused_grads[name], rtol=1e-10, atol=1e-12, msg=name)
    # the two stages partition the model's parameters
    v = {id(p) for p in stages["vision"].parameters()}
    lang = {id(p) for p in stages["language"].parameters()}
    assert not v & lang and v | lang == {id(p) for p in model.parameters()}


def test_placeholder_row_mismatch_is_an_error():
    model = tiny_llava("clip")
    stages = split_llava(model)
    batch = collate(llava_samples(model, 1))
    with pytest.raises(ValueError, match="16 image placeholder tokens .* but 15 image rows"):
        stages["language"](batch["input_ids"], torch.zeros(15, 64))


@pytest.mark.parametrize("vision,strategy_tokens", [("clip", 16), ("siglip", 16)])
def test_adapter_counts_tokens_and_rejects_mismatches(vision, strategy_tokens):
    from ds_hetero.families.llava.adapter import LlavaAdapter

    model = tiny_llava(vision)
    adapter = LlavaAdapter(model)
    samples = llava_samples(model, 2)
    text_only = {"input_ids": samples[1]["input_ids"][16:], "labels": samples[1]["labels"][16:]}
    for i, s in enumerate(samples + [text_only]):
        adapter.check_sample(s, i)
    assert adapter.tokens_per_image == strategy_tokens
    assert adapter.vision_inputs(samples + [text_only])["pixel_values"].shape == (2, 3, 32, 32)
    assert adapter.vision_inputs([text_only])["pixel_values"].shape == (0, 3, 32, 32)
    batch = adapter.language_inputs([samples[0], text_only])
    assert batch["input_ids"].shape == (2, 24) and batch["attention_mask"][1].sum() == 8
    assert (batch["labels"][1, 8:] == -100).all()
    with pytest.raises(ValueError, match="16 image placeholder tokens .* 0 image"):
        adapter.check_sample({"input_ids": samples[0]["input_ids"], "labels": samples[0]["labels"]}, 0)


@pytest.mark.parametrize("vision", ["clip", "siglip"])
def test_trainable_parameters_are_exactly_those_with_gradients(vision):
    model = tiny_llava(vision, seed=1)
    stages = split_llava(model)
    batch = collate(llava_samples(model, 2))
    stages["language"](batch["input_ids"], stages["vision"](batch["pixel_values"])).sum().backward()
    with_grad = {id(p) for p in stages["vision"].parameters() if p.grad is not None}
    assert {id(p) for p in stages["vision"].trainable_parameters()} == with_grad
