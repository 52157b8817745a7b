"""Videos in the Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5), one process, no engine:
the split stages fed item by item equal the Hugging Face model fed `pixel_values_videos` /
`video_grid_thw`; placeholder runs, grids and patches are checked against each other; a clip's cost
and its balance over encoder ranks; positions that ignore time differ.
(The engine's training parity: tests/engine/test_qwen_video_parity.py, test_qwen3_video_parity.py.)
"""

import pytest
import torch

from ds_hetero import toy
from ds_hetero.config import load_config
from ds_hetero.families import adapter_for
from ds_hetero.step.balance import encoder_assignment
from ds_hetero.testing.video_samples import hf_video_inputs, video_samples

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
ITEMS = [[("video", (2, 4, 4))], [("image", (1, 4, 8)), ("video", (3, 4, 8))], [],
         [("video", (2, 8, 4)), ("image", (1, 4, 4))]]


def _model(family):
    from ds_hetero.families.qwen3_vl_moe.tiny import tiny_qwen3_vl_moe

    build = tiny_qwen3_vl_moe if family == "qwen3_vl_moe" else getattr(toy, f"tiny_{family}")
    model = build(seed=3)
    return model.eval(), adapter_for(model)


def _samples(model, adapter, items=ITEMS, seed=1):
    return video_samples(model, items, seed=seed, frame_runs=adapter.FRAME_RUNS,
                         seconds=adapter.SECONDS_FIELD is not None)


@pytest.mark.parametrize("family", FAMILIES + ("qwen3_vl_moe", "qwen3_5_moe"))  # the MoE homes share the adapters
def test_stages_item_by_item_equal_the_model_on_video_fields(family):
    model, adapter = _model(family)
    samples = _samples(model, adapter)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    with torch.no_grad():
        want = model(**hf_video_inputs(model, adapter, samples)).logits
        stages, batch = adapter.split(), adapter.language_inputs(samples)
        # every vision item alone, as balancing may place each on its own encoder rank
        rows = torch.cat([stages["vision"](**adapter.vision_inputs([adapter.select_images(s, [k])]))
                          for s in samples for k in range(len(adapter.image_rows(s)))])
        got = stages["language"](batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    keep = batch["attention_mask"].bool()
    assert torch.allclose(got[keep], want[keep], rtol=1e-5, atol=1e-6), float((got - want)[keep].abs().max())


@pytest.mark.parametrize("family", FAMILIES)
def test_items_are_clips_or_frames_in_sequence_order(family):
    model, adapter = _model(family)
    s = _samples(model, adapter, [[("image", (1, 4, 8)), ("video", (3, 4, 8))]])[0]
    # Qwen3-VL / Qwen3.5 write each temporal patch as its own run: three items of 8 rows
    assert adapter.image_rows(s) == ([8, 8, 8, 8] if adapter.FRAME_RUNS else [8, 24])
    picked = adapter.select_images(s, [1])
    assert picked["image_grid_thw"].tolist() == ([[1, 4, 8]] if adapter.FRAME_RUNS else [[3, 4, 8]])
    assert torch.equal(picked["pixel_values"], s["pixel_values_videos"][:(1 if adapter.FRAME_RUNS else 3) * 32])


@pytest.mark.parametrize("family", FAMILIES)
def test_video_fields_that_disagree_are_refused_by_name(family):
    model, adapter = _model(family)
    s = _samples(model, adapter, [[("video", (2, 4, 4))]])[0]
    with pytest.raises(ValueError, match="8 video placeholder tokens .* gives 4"):
        adapter.check_sample({**s, "video_grid_thw": torch.tensor([[1, 4, 4]])}, 0)
    if adapter.FRAME_RUNS:  # the same rows as one frame, where the processor writes two
        with pytest.raises(ValueError, match="video placeholder runs .* each temporal patch"):
            adapter.check_sample({**s, "video_grid_thw": torch.tensor([[1, 8, 4]])}, 0)
    with pytest.raises(ValueError, match="pixel_values_videos has"):
        adapter.check_sample({**s, "pixel_values_videos": s["pixel_values_videos"][:-1]}, 0)
    with pytest.raises(ValueError, match="without pixel_values_videos"):
        adapter.check_sample({k: v for k, v in s.items() if k != "pixel_values_videos"}, 0)


def test_a_clip_costs_its_frames_and_qwen3_frames_balance_over_ranks():
    _, q2 = _model("qwen2_vl")
    # a one-run clip: its frames attend within themselves, so it costs less than an image of its rows
    assert q2.video_cost(16) == q2.image_cost(16)  # within one frame's bound: the same attention length
    assert q2.video_cost(4 * 768) < q2.image_cost(4 * 768)
    model, q3 = _model("qwen3_vl")
    samples = _samples(model, q3, [[("video", (4, 8, 8))], [], [], []])
    cfg = load_config({"train_batch_size": 4, "hetero_parallel": {
        "micro_batches": 1, "stages": {"vision": {"dp": 4}, "language": {"dp": 4}}}}, 4)
    plan = encoder_assignment(cfg, q3, samples, "vision", 0)
    assert sorted(plan.rank) == [0, 1, 2, 3]  # one clip's four frames, one per encoder rank
    light = [{"input_ids": s["input_ids"], "light": True} for s in samples]
    assert encoder_assignment(cfg, q3, light, "vision", 0) == plan  # from input_ids alone


def test_qwen2_5_vl_positions_space_a_clip_by_its_seconds():
    model, adapter = _model("qwen2_5_vl")
    s = _samples(model, adapter, [[("video", (3, 4, 4))]])[0]
    video = s["input_ids"] == model.config.video_token_id
    def temporal(sample):
        return adapter.language_inputs([sample])["position_ids"][0, 0][video]
    step = model.config.vision_config.tokens_per_second * 0.5  # its seconds per temporal patch: 0.5
    t = temporal(s)
    assert (t.unique(sorted=True) - t.min()).tolist() == [int(k * step) for k in range(3)]
    assert not torch.equal(t, temporal({**s, "second_per_grid_ts": torch.tensor([2.0])}))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_a_collated_video_batch_splits_into_its_samples(family):
    from ds_hetero.data import split_collated

    model, adapter = _model(family)
    samples = _samples(model, adapter, ITEMS + [[("video", (1, 4, 4)), ("video", (2, 4, 4))]])
    kwargs = hf_video_inputs(model, adapter, samples)  # the batch as a processor + collator give it
    kwargs.pop("mm_token_type_ids")
    cut = split_collated(kwargs, adapter)
    assert len(cut) == len(samples)
    for got, want in zip(cut, samples):
        assert set(got) == set(want), (sorted(got), sorted(want))
        for key, value in want.items():
            assert torch.equal(got[key], value), key
    bad = {**kwargs, "video_grid_thw": kwargs["video_grid_thw"][:-1]}
    with pytest.raises(ValueError, match="video_grid_thw"):
        split_collated(bad, adapter)


@pytest.mark.parametrize("family", FAMILIES)
def test_shape_clips_are_samples_whose_caption_follows_time(family):
    from ds_hetero.families.qwen2_vl.sample_format import Qwen2VLFormat
    from ds_hetero.families.qwen2_vl.video_frames import patch_rows
    from ds_hetero.toy.shape_clips import ShapeClipsDataset

    model, adapter = _model(family)
    data = ShapeClipsDataset(model, 16, seed=1)
    for i in range(len(data)):
        s = data[i]
        adapter.check_sample(s, i)
        assert torch.equal(s["input_ids"], data.input_ids(i))  # the loader's light read: no rendering
    words = data.vocab.decode(data[1]["input_ids"])
    assert " and at the " in words  # clip 1 moves: both places, first one first
    # a clip of one still image repeated is that image patchified as the image processor does
    v = model.config.vision_config
    image = torch.randn(3, 16, 16)
    still = patch_rows(image.expand(2, -1, -1, -1), v.patch_size, v.spatial_merge_size, v.temporal_patch_size)
    fmt = Qwen2VLFormat(v.patch_size, v.spatial_merge_size, v.temporal_patch_size, 0, 0)
    assert torch.equal(still, fmt.patches(image))
