"""benchmarks/packing_families.py: each family's mix sample is what its own Hugging Face model takes (the
placeholders match the pixels: the model's forward accepts it and trains on the text), one process."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import packing_families  # noqa: E402


@pytest.mark.parametrize("family", packing_families.FAMILIES)
def test_a_mix_sample_is_the_familys_own_format(family):
    model = packing_families.make_model(family, scale=9, text_hidden=32, text_layers=4)
    gen = torch.Generator().manual_seed(0)
    sample = packing_families.mix_sample(model, family, images=2, text_len=7, scale=9, gen=gen)
    placeholders = int((sample["input_ids"] == model.config.image_token_id).sum())
    assert placeholders == 2 * 576 // 9  # 64 language tokens per image at scale 9
    assert int((sample["labels"] != packing_families.IGNORE).sum()) == 7
    batch = {k: v.unsqueeze(0) if k in ("input_ids", "labels") else v for k, v in sample.items()}
    images = (batch["input_ids"] == model.config.image_token_id).long()
    if family == "gemma3":  # the processor's mask: image tokens attend both ways
        batch["token_type_ids"] = images
    if family == "qwen3.5":  # the processor's M-RoPE types (1: image)
        batch["mm_token_type_ids"] = images
    loss = model(**batch).loss
    assert torch.isfinite(loss)
    text_only = packing_families.mix_sample(model, family, images=0, text_len=5, scale=9, gen=gen)
    assert set(text_only) == {"input_ids", "labels"}


def test_an_unknown_family_is_named():
    with pytest.raises(ValueError, match="--family"):
        packing_families.make_model("mllama", 9, 32, 2)
