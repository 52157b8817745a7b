"""The two-stage LLaVA split reproduces the fused model."""

import pytest
import torch

from ds_hetero.models import split_llava
from ds_hetero.models.tiny import tiny_llava
from tests.llava_data import collate, llava_samples, token_loss_sum


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
