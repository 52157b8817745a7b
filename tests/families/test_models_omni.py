"""Qwen2.5-Omni thinker adapter (single process): the stages reproduce the thinker's own forward."""

import pytest
import torch

from ds_hetero.loss import label_token_count, token_loss_sum
from ds_hetero.families import adapter_for
from ds_hetero.toy import tiny_qwen2_5_omni
from ds_hetero.testing.omni_samples import hf_inputs, omni_samples

ITEMS = [[("image", (1, 4, 4))], [("audio", 20)], [("audio", 13), ("image", (1, 4, 8)), ("audio", 24)], [],
         [("image", (1, 8, 4)), ("audio", 17)]]


@pytest.fixture(scope="module")
def model():
    return tiny_qwen2_5_omni(seed=3)


def test_stages_give_the_thinkers_logits_loss_and_gradients(model):
    adapter = adapter_for(model)
    samples = omni_samples(model, ITEMS, seed=1)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    out = model(**hf_inputs(model, adapter, samples))
    out.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    stages = adapter.split()
    batch = adapter.language_inputs(samples)
    rows = (stages["vision"](**adapter.vision_inputs(samples)), stages["audio"](**adapter.audio_inputs(samples)))
    logits = stages["language"](batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    loss = token_loss_sum(logits, batch["labels"]) / sum(label_token_count(s["labels"]) for s in samples)
    loss.backward()
    assert torch.equal(logits, out.logits) and float(loss) == pytest.approx(float(out.loss), rel=1e-6)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys() and any(".audio_tower." in n for n in got) and any(".visual." in n for n in got)
    for n in want:
        assert torch.allclose(got[n], want[n], rtol=1e-5, atol=1e-7), n
    # the unused audio bos/eos embedding gets no gradient and is left out of the optimizer
    assert not any("audio_bos_eos_token" in n for n in got)
    names = {id(p) for p in stages["audio"].trainable_parameters()}
    assert id(model.model.audio_tower.audio_bos_eos_token.weight) not in names


def test_positions_of_a_sample_do_not_depend_on_its_batch(model):
    adapter = adapter_for(model)
    samples = omni_samples(model, ITEMS, seed=2)
    full = adapter.language_inputs(samples)["position_ids"]
    for i, s in enumerate(samples):
        alone = adapter.language_inputs([s])["position_ids"]
        n = alone.shape[-1]
        assert torch.equal(alone[:, 0], full[:, i, :n]), i


def test_empty_encoders_give_no_rows_and_a_graph(model):
    adapter = adapter_for(model)
    stages = adapter.split()
    text = omni_samples(model, [[]])
    for name, inputs in (("vision", adapter.vision_inputs(text)), ("audio", adapter.audio_inputs(text))):
        rows = stages[name](**inputs)
        assert rows.shape == (0, 64) and rows.requires_grad, name


def test_ports_select_and_cost(model):
    adapter = adapter_for(model)
    sample = omni_samples(model, [ITEMS[2]])[0]
    ports = adapter.encoders()
    assert list(ports) == ["vision", "audio"]
    assert ports["audio"].rows(sample) == [3, 6] and ports["vision"].rows(sample) == [8]
    one = ports["audio"].select(sample, [1])
    assert one["audio_feature_lengths"].tolist() == [24] and one["input_features"].shape == (16, 24)
    assert adapter.audio_cost(6) > adapter.audio_cost(3) > 0


@pytest.mark.parametrize("field, change, words", [
    ("audio_feature_lengths", lambda t: t + 4, "do not match audio_feature_lengths"),
    ("input_features", lambda t: t[:, :-1], "input_features has shape"),
    ("image_grid_thw", lambda t: t * torch.tensor([[1, 2, 1]]), "do not match image_grid_thw"),
])
def test_malformed_samples_are_refused(model, field, change, words):
    adapter = adapter_for(model)
    sample = omni_samples(model, [ITEMS[2]])[0]
    sample[field] = change(sample[field])
    with pytest.raises(ValueError, match=words):
        adapter.check_sample(sample, 0)


VIDEO_ITEMS = [[("video", (2, 4, 4))], [("image", (1, 4, 4)), ("video", (2, 4, 8)), ("audio", 20)],
               [("audio", 13), ("video", (1, 8, 4)), ("image", (1, 4, 8)), ("video", (2, 4, 4))], [],
               [("image", (1, 8, 4))]]


def test_videos_go_through_the_vision_stage_as_the_thinker_takes_them(model):
    """Images and videos, interleaved with clips: the stages give the thinker's own loss and gradients
    (HF: pixel_values_videos / video_grid_thw / video_second_per_grid and its TMRoPE positions)."""
    model.zero_grad(set_to_none=True)  # the module's model: earlier tests leave gradients
    adapter = adapter_for(model)
    samples = omni_samples(model, VIDEO_ITEMS, seed=4)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    kwargs = hf_inputs(model, adapter, samples)
    assert "pixel_values_videos" in kwargs and "pixel_values" in kwargs
    out = model(**kwargs)
    out.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    stages = adapter.split()
    batch = adapter.language_inputs(samples)
    # the positions are the thinker's own, videos' temporal spacing included
    hf_positions, _ = model.model.get_rope_index(
        kwargs["input_ids"], kwargs["image_grid_thw"], kwargs["video_grid_thw"], kwargs["attention_mask"], False,
        kwargs["feature_attention_mask"].sum(-1), kwargs["video_second_per_grid"])
    assert torch.equal(batch["position_ids"], hf_positions)
    rows = (stages["vision"](**adapter.vision_inputs(samples)), stages["audio"](**adapter.audio_inputs(samples)))
    logits = stages["language"](batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    loss = token_loss_sum(logits, batch["labels"]) / sum(label_token_count(s["labels"]) for s in samples)
    loss.backward()
    assert torch.allclose(logits, out.logits, rtol=1e-5, atol=1e-6)
    assert float(loss) == pytest.approx(float(out.loss), rel=1e-6)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys()
    for n in want:
        assert torch.allclose(got[n], want[n], rtol=1e-5, atol=1e-7), n
    model.zero_grad(set_to_none=True)


def test_video_items_in_sequence_order_and_selectable(model):
    adapter = adapter_for(model)
    s = omni_samples(model, [[("video", (2, 4, 4)), ("image", (1, 4, 8)), ("video", (1, 4, 4))]], seed=5)[0]
    assert adapter.image_rows(s) == [8, 8, 4]
    assert adapter.encoders()["vision"].count(s) == 20
    picked = adapter.select_images(s, [1, 2])  # the image, then the second video
    assert picked["image_grid_thw"].tolist() == [[1, 4, 8], [1, 4, 4]]
    assert torch.equal(picked["pixel_values"][:32], s["pixel_values"])
    assert torch.equal(picked["pixel_values"][32:], s["pixel_values_videos"][32:])
    both = adapter.vision_inputs([s])
    assert both["image_grid_thw"].tolist() == [[2, 4, 4], [1, 4, 8], [1, 4, 4]]


def test_video_fields_checked(model):
    adapter = adapter_for(model)
    s = omni_samples(model, [[("video", (2, 4, 4))]], seed=6)[0]
    with pytest.raises(ValueError, match="video_second_per_grid"):
        adapter.check_sample({k: v for k, v in s.items() if k != "video_second_per_grid"}, 0)
    with pytest.raises(ValueError, match="video placeholder runs"):
        adapter.check_sample({**s, "video_grid_thw": torch.tensor([[1, 4, 4]])}, 0)
    with pytest.raises(ValueError, match="use_audio_in_video"):
        adapter.check_sample({**s, "use_audio_in_video": True}, 0)
