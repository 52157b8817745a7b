"""Qwen2-VL split into stages reproduces the fused model, with variable image sizes and a text-only sample."""

import pytest
import torch

from ds_hetero.families.qwen2_vl.adapter import Qwen2VLAdapter
from ds_hetero.toy import tiny_qwen2_vl
from ds_hetero.testing.batches import qwen_samples, token_loss_sum

GRIDS = [(1, 4, 4), None, (1, 4, 8), (1, 8, 4)]  # 4, 0, 8, 8 image tokens


def test_split_equals_fused_with_variable_image_sizes():
    model = tiny_qwen2_vl(seed=2).double()
    adapter = Qwen2VLAdapter(model)
    samples = qwen_samples(model, GRIDS)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    assert [adapter.image_token_count(s) for s in samples] == [4, 0, 8, 8]
    batch = adapter.language_inputs(samples)
    vision = adapter.vision_inputs(samples)
    fused = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
        pixel_values=vision["pixel_values"].double(), image_grid_thw=vision["image_grid_thw"],
        mm_token_type_ids=(batch["input_ids"] == model.config.image_token_id).int(),
    ).logits
    token_loss_sum(fused, batch["labels"]).backward()
    fused_grads = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    stages = adapter.split()
    rows = stages["vision"](**vision)
    assert rows.shape == (20, model.config.text_config.hidden_size)
    logits = stages["language"](batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(logits[mask], fused[mask], rtol=0, atol=1e-12)
    token_loss_sum(logits, batch["labels"]).backward()
    for name, p in model.named_parameters():
        if fused_grads[name] is None:
            assert p.grad is None, name
        else:
            torch.testing.assert_close(p.grad, fused_grads[name], rtol=1e-9, atol=1e-12, msg=name)


def test_text_only_micro_batch_gives_empty_rows_that_still_reach_the_vision_stage():
    model = tiny_qwen2_vl(seed=2)
    adapter = Qwen2VLAdapter(model)
    stages = adapter.split()
    rows = stages["vision"](**adapter.vision_inputs(qwen_samples(model, [None, None])))
    assert rows.shape == (0, 64) and rows.requires_grad
    rows.sum().backward()


def test_mismatched_image_fields_are_rejected():
    model = tiny_qwen2_vl(seed=2)
    adapter = Qwen2VLAdapter(model)
    sample = qwen_samples(model, [(1, 4, 4)])[0]
    sample["image_grid_thw"] = torch.tensor([[1, 4, 8]])
    with pytest.raises(ValueError, match="4 image placeholder tokens .* gives 8"):
        adapter.check_sample(sample, 3)
