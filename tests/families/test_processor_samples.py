"""Samples as each family's own Hugging Face processor emits them (built locally, no download), whole:
every field of its output for one sample (input_ids [1, S], attention_mask, mm_token_type_ids /
token_type_ids, the media fields), plus labels.

Per family: check_sample accepts it and the stages' inputs equal those of the trimmed sample the
other tests use. Qwen2.5-Omni: its processor's audio form (`input_features` [clips, mel, 3000]
padded, `feature_attention_mask`) gives the thinker's own loss and gradients, where the reference is
the unmodified thinker fed the processor's output for the whole batch. Anything else is refused
naming the field: a media field the family does not take, padding inside a sample, audio forms the
thinker's forward does not take. Distributed parity on this form: tests/engine/test_omni_processor_parity.py.
"""

import numpy as np
import pytest
import torch

from ds_hetero.data.samples import as_sample
from ds_hetero.loss import label_token_count, token_loss_sum
from ds_hetero.families import adapter_for
from ds_hetero.toy import tiny_llava, tiny_qwen2_5_omni, tiny_qwen2_vl
from ds_hetero.toy import (tiny_gemma3, tiny_internvl, tiny_llava_onevision, tiny_qwen2_5_vl,
                                            tiny_qwen3_vl)
from tests.helpers import family_processors as fp

QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
OMNI_ITEMS = [[("audio", 0.2)], [("image", (32, 32)), ("audio", 0.13)], [],
              [("audio", 0.3), ("image", (16, 32)), ("audio", 0.17)], [("image", (16, 16))]]


def _families():
    from ds_hetero.toy.processors import tiny_llava_processor, tiny_qwen2_vl_processor

    return {
        "llava": (lambda: tiny_llava("clip", seed=0), tiny_llava_processor, "w5 <image> w6"),
        "qwen2_vl": (lambda: tiny_qwen2_vl(seed=0), tiny_qwen2_vl_processor, f"w5 {QWEN_IMAGE} w6"),
        "qwen2_5_vl": (lambda: tiny_qwen2_5_vl(seed=0), fp.qwen2_5_vl_processor, f"w5 {QWEN_IMAGE} w6 {QWEN_IMAGE}"),
        "qwen3_vl": (lambda: tiny_qwen3_vl(seed=0), fp.qwen3_vl_processor, f"{QWEN_IMAGE} w5 w6"),
        "gemma3": (lambda: tiny_gemma3(seed=0), fp.gemma3_processor, "w5 <start_of_image> w6"),
        "internvl": (lambda: tiny_internvl(seed=0), fp.internvl_processor, "w5 <IMG_CONTEXT> w6 <IMG_CONTEXT>"),
        "llava_onevision": (lambda: tiny_llava_onevision(seed=0), fp.llava_onevision_processor, "w5 <image> w6"),
    }


@pytest.mark.parametrize("family", list(_families()))
def test_the_processors_whole_output_is_a_sample(family):
    build, processor, text = _families()[family]
    model = build()
    rng = np.random.default_rng(0)
    n_images = sum(map(text.count, ("<image>", "image_pad", "start_of_image", "IMG_CONTEXT")))
    images = [rng.integers(0, 256, (16 * (1 + k), 32, 3), dtype=np.uint8) for k in range(n_images)]
    out = processor(model)(text=[text], images=[images], return_tensors="pt")
    whole = as_sample({**out, "labels": out["input_ids"].clone()}, 0)
    trimmed = {"input_ids": whole["input_ids"][0], "labels": whole["labels"][0],
               **{k: whole[k] for k in ("pixel_values", "image_grid_thw", "image_sizes") if k in whole}}
    adapter = adapter_for(model)
    adapter.check_sample(whole, 0)
    for key, value in adapter.vision_inputs([whole]).items():
        assert torch.equal(value, adapter.vision_inputs([trimmed])[key]), (family, key)
    for key, value in adapter.language_inputs([whole]).items():
        assert value is None or torch.equal(value, adapter.language_inputs([trimmed])[key]), (family, key)
    # a media field the family does not read is refused by name, not trained without
    # (an audio field here: the Qwen-VL families take videos, docs/video.md)
    with pytest.raises(ValueError, match="'input_features' is not a field"):
        adapter.check_sample({**whole, "input_features": torch.zeros(4, 8)}, 0)
    padded = {**whole, "attention_mask": torch.cat([whole["attention_mask"], torch.zeros(1, 2, dtype=torch.long)], 1)}
    with pytest.raises(ValueError, match="attention_mask marks 2 padding"):
        adapter.check_sample(padded, 0)


@pytest.fixture(scope="module")
def omni():
    model = tiny_qwen2_5_omni(seed=3)
    processor = fp.qwen2_5_omni_processor(model)
    return model, processor, fp.omni_processor_samples(processor, model, OMNI_ITEMS, seed=1)


def test_omni_processor_form_gives_the_thinkers_loss_and_gradients(omni):
    model, processor, samples = omni
    adapter = adapter_for(model)
    assert samples[1]["input_features"].shape == (1, 16, 3000) and "feature_attention_mask" in samples[1]
    for i, s in enumerate(samples):
        adapter.check_sample(as_sample(s, i), i)
    assert [adapter.audio_rows(s) for s in samples][:2] == [[5], [3]]  # 20 and 13 frames
    # the reference: the unmodified thinker on the processor's output for the whole (left-padded) batch
    out = model(**_batch_output(samples))
    out.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    stages = adapter.split()
    lang = adapter.language_inputs(samples)
    rows = (stages["vision"](**adapter.vision_inputs(samples)), stages["audio"](**adapter.audio_inputs(samples)))
    logits = stages["language"](lang["input_ids"], rows, lang["attention_mask"], lang["position_ids"])
    loss = token_loss_sum(logits, lang["labels"]) / sum(label_token_count(s["labels"]) for s in samples)
    loss.backward()
    assert float(loss) == pytest.approx(float(out.loss), rel=1e-6)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys() and any("audio_tower" in n.split(".") for n in got)  # top-level before 5.23
    for n in want:
        assert torch.allclose(got[n], want[n], rtol=1e-4, atol=1e-7), n
    model.zero_grad(set_to_none=True)


def _batch_output(samples):
    """The processor's output for all samples at once, with labels (the padding and placeholders -100)."""
    from transformers import BatchFeature

    keys = ("input_features", "feature_attention_mask", "pixel_values", "image_grid_thw")
    width = max(s["input_ids"].shape[-1] for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    mask, labels = torch.zeros_like(ids), torch.full_like(ids, -100)
    for i, s in enumerate(samples):  # left-padded, as the processor pads a batch
        n = s["input_ids"].shape[-1]
        ids[i, width - n:], mask[i, width - n:], labels[i, width - n:] = s["input_ids"][0], 1, s["labels"][0]
        labels[i, width - n] = -100  # a sample's first token is predicted by no token of it (here: by a pad)
    out = BatchFeature({"input_ids": ids, "attention_mask": mask, "labels": labels})
    for key in keys:
        parts = [s[key] for s in samples if key in s]
        if parts:
            out[key] = torch.cat(parts)
    return out


def test_omni_both_forms_give_the_same_inputs_and_positions(omni):
    model, _, samples = omni
    adapter = adapter_for(model)
    flat = []
    for s in samples:
        features, lengths = (None, None)
        if "input_features" in s:
            from ds_hetero.families.qwen2_5_omni.adapter import audio_fields

            features, lengths = audio_fields(s)
        f = {k: v for k, v in s.items() if k not in ("input_features", "feature_attention_mask")}
        flat.append(f if features is None else {**f, "input_features": features, "audio_feature_lengths": lengths})
    for i, s in enumerate(flat):
        adapter.check_sample(s, i)
    a, b = adapter.audio_inputs(samples), adapter.audio_inputs(flat)
    assert torch.equal(a["input_features"], b["input_features"]) and torch.equal(a["feature_lens"], b["feature_lens"])
    assert torch.equal(adapter.language_inputs(samples)["position_ids"], adapter.language_inputs(flat)["position_ids"])
    one = adapter.select_audios(samples[3], [1])
    assert one["audio_feature_lengths"].tolist() == [17] and one["input_features"].shape == (16, 17)


def test_omni_processor_batch_split_per_sample_is_its_per_sample_output(omni):
    """The processor's collated output for the whole batch (left-padded ids, all clips' rows) cut by
    split_collated gives each sample the processor's own output for it alone."""
    from ds_hetero.data.samples import split_collated

    model, processor, samples = omni
    split = split_collated(fp.omni_processor_batch(processor, model, OMNI_ITEMS, seed=1), adapter_for(model))
    assert len(split) == len(samples)
    for got, want in zip(split, samples):
        assert torch.equal(got["input_ids"], want["input_ids"][0]) and torch.equal(got["labels"], want["labels"][0])
        for key in ("input_features", "feature_attention_mask", "pixel_values", "image_grid_thw"):
            assert (key in got) == (key in want), key
            if key in want:
                assert torch.equal(got[key], want[key]), key
    bad = fp.omni_processor_batch(processor, model, OMNI_ITEMS, seed=1)
    bad["feature_attention_mask"] = bad["feature_attention_mask"][:-1]
    with pytest.raises(ValueError, match="feature_attention_mask"):
        split_collated(bad, adapter_for(model))


@pytest.mark.parametrize("change, words", [
    (lambda s: s.pop("feature_attention_mask"), "input_features has shape .1, 16, 3000. and no feature_attention_mask"),
    (lambda s: s.update(feature_attention_mask=s["feature_attention_mask"][:, :-1]), "do not fit"),
    (lambda s: s.update(audio_feature_lengths=torch.tensor([7])), "audio_feature_lengths .7. disagree"),
    (lambda s: s.update(feature_attention_mask=s["feature_attention_mask"] * 2), "other than 0 and 1"),
    (lambda s: s.pop("input_features"), "feature_attention_mask without input_features"),
])
def test_omni_other_audio_forms_are_refused_by_name(omni, change, words):
    model, _, samples = omni
    sample = dict(samples[0])
    change(sample)
    with pytest.raises(ValueError, match=words):
        adapter_for(model).check_sample(sample, 0)
