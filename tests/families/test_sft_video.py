"""Video files on the real-data path (sft_data/clips.py, video_files.py; families/qwen2_vl/video_frames.py).

Pure: one process, clips of 8-16 frames written with PyAV into tmp folders (tests/helpers/video_files.py).
What each test shows:
- the settings are read from the processor's video processor (transformers' attribute names), else the
  video processors' class defaults at the image processor's patch sizes; a processor no family reads
  videos for has none;
- the kept frames are those of transformers' video processors' sampling rules (Qwen2-VL / Qwen2.5-VL:
  fps 2, whole temporal patches, min / max frames, `arange`; Qwen3-VL / Qwen3.5: `int` frames, `linspace`,
  24 fps without a rate), worked out by hand from transformers 5.23's code for edge cases;
- the frame size is the family's smart resize: Qwen2's is the image rule (the image processor's own patch
  count at the video bounds, the per-frame cap too), Qwen3's bounds the whole clip (values worked out by hand);
- a clip's pixels are, slot by slot, what the family's image processor gives each sampled frame (the same
  resize, rescale and normalization, and the video processors' patch order: temporal patch, merge block,
  (channel, time, py, px)); negative control: the frames of a temporal patch swapped fail the comparison;
- the length index's ids equal the real encoding's for clips beside images and text (four families, both
  placeholder spellings), Qwen2.5-VL's `second_per_grid_ts` is 2 / the sampled frame rate, and preparing
  decodes only the clips of the rows that check the rules (the first video row, the first image row), never
  the others;
- a clip changed after the index raises naming the row and the index folder (negative control of the check);
- bad clips (missing, unreadable, no frames, too few frames to sample, a processor that reads no video)
  are named by file and row at index time and skipped under skip_bad_rows;
- the shipped example is make_shapes_clips.py's output and reads.
"""

import json
import os
import shutil

import numpy as np
import pytest
import torch

from ds_hetero.families import family_named, video_settings_of
from ds_hetero.families.qwen2_vl.video_frames import (VideoSettings, clip_grid, clip_pixels, frame_size,
                                                      sample_indices)
from ds_hetero.sft_data import BadRowError, SFTDataset
from ds_hetero.sft_data.video_files import clip_header, decode_frames
from tests.helpers.video_files import VIDEO_ROWS, messages_rows, write_clip

pytest.importorskip("av")


def _settings(rule: str, **kw) -> VideoSettings:
    base = dict(rule=rule, fps=2.0, min_frames=4, max_frames=768, min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28,
                patch_size=14, merge_size=2, temporal_patch_size=2, image_mean=(0.5,) * 3, image_std=(0.5,) * 3)
    return VideoSettings(**{**base, **kw})


@pytest.fixture(scope="module")
def processors():
    from ds_hetero.toy.processors import tiny_processor

    return {name: tiny_processor(family_named(name).tiny()) for name in ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3.5")}


# ------------------------------------------------------------------ settings
def test_settings_are_read_from_the_processors_video_processor(processors):
    """A transformers video processor's attributes (its `size` a SizeDict, Qwen2-VL's `fps` unset) are read as
    they are; a processor without one takes the video processors' class defaults at its image processor's
    patch sizes, mean and std."""
    from types import SimpleNamespace

    from transformers.image_utils import SizeDict

    images = processors["qwen2-vl"].image_processor
    hf = SimpleNamespace(size=SizeDict(shortest_edge=3136, longest_edge=602112), fps=None, min_frames=4,
                         max_frames=768, patch_size=14, merge_size=2, temporal_patch_size=2,
                         image_mean=[0.48, 0.45, 0.40], image_std=[0.26, 0.26, 0.27], rescale_factor=1 / 255,
                         cap_pixels_per_frame=None, max_video_tokens=128000)
    checkpoint = type("Qwen2VLProcessor", (), {})()  # found by its class name, as the registry finds processors
    checkpoint.video_processor, checkpoint.image_processor = hf, images
    read = video_settings_of(checkpoint)
    assert (read.rule, read.fps, read.min_pixels, read.max_pixels, read.patch_size, read.image_mean) == \
        ("qwen2", 2.0, 3136, 602112, 14, (0.48, 0.45, 0.40))
    bare = type("Qwen3VLProcessor", (), {})()
    bare.image_processor = images
    defaults = video_settings_of(bare)
    factor = (images.patch_size * images.merge_size) ** 2
    assert (defaults.rule, defaults.min_pixels, defaults.max_pixels, defaults.max_video_tokens) == \
        ("qwen3", 128 * factor, 768 * factor, 768)
    assert defaults.image_mean == tuple(images.image_mean) and defaults.patch_size == images.patch_size
    assert video_settings_of(type("LlavaProcessor", (), {})()) is None  # negative control: no family reads it


# ------------------------------------------------------------------ sampling
@pytest.mark.parametrize("rule, total, fps, want", [
    # Qwen2: n = total / fps * 2, >= min_frames 4, <= floor(min(max, total) / 2) * 2, floored to whole temporal
    # patches; arange(0, total, total / n).int()
    ("qwen2", 12, 8.0, [0, 3, 6, 9]),                 # 3 -> 4 (min) -> step 3
    ("qwen2", 300, 30.0, list(range(0, 300, 15))),    # 10 s -> 20 frames
    ("qwen2", 7, 30.0, [0, 1, 3, 5]),                 # 4 frames, step 1.75 truncated
    ("qwen2", 3, 30.0, [0, 1]),                       # 3 frames hold one temporal patch: min(4, 2, 3) = 2
    # Qwen3: n = int(total / fps * 2), clamped to [4, min(768, total)], not rounded; linspace(0, total - 1, n)
    ("qwen3", 12, 8.0, [0, 4, 7, 11]),                # int(3) -> 4; 0, 3.67, 7.33, 11 rounded
    ("qwen3", 5, None, [0, 1, 3, 4]),                 # no rate: 24 fps -> int(0.42) -> 4
    ("qwen3", 15, 6.0, [0, 4, 7, 10, 14]),            # int(5): an odd count (the last frame fills its patch)
    ("qwen3", 2000, 1.0, np.linspace(0, 1999, 768).round().astype(int).tolist()),  # max_frames
])
def test_frames_are_sampled_as_the_video_processors_do(rule, total, fps, want):
    assert sample_indices(_settings(rule), total, fps) == want


@pytest.mark.parametrize("rule, total, fps", [("qwen2", 1, 8.0), ("qwen3", 1, 8.0), ("qwen2", 12, None)])
def test_a_clip_the_rule_cannot_sample_is_refused(rule, total, fps):
    with pytest.raises(ValueError, match="frame"):
        sample_indices(_settings(rule), total, fps)


# ------------------------------------------------------------------ size
@pytest.mark.parametrize("height, width", [(480, 640), (84, 112), (30, 2000), (1080, 1920), (56, 56)])
def test_qwen2_frames_are_resized_by_the_image_rule(height, width, processors):
    """The image processor's own patch count at the video bounds is the clip's per-frame count."""
    from transformers import Qwen2VLImageProcessorPil

    s = _settings("qwen2")
    image = Qwen2VLImageProcessorPil(size={"shortest_edge": s.min_pixels, "longest_edge": s.max_pixels})
    t, h, w = clip_grid(s, 8, height, width)
    assert t == 4 and h * w == image.get_number_of_image_patches(height, width, {})
    capped = _settings("qwen2", cap_pixels_per_frame=True, max_video_tokens=1000)
    # the cap: max(min(768 * 28^2, int(1000 * 28^2 * 0.9) * 2 // 64), int(128 * 28^2 * 1.05)) pixels a frame
    budget = max(min(768 * 784, int(1000 * 784 * 0.9) * 2 // 64), int(128 * 784 * 1.05))
    image = Qwen2VLImageProcessorPil(size={"shortest_edge": s.min_pixels, "longest_edge": budget})
    _, h, w = clip_grid(capped, 64, height, width)
    assert h * w == image.get_number_of_image_patches(height, width, {})


def test_qwen3_resize_bounds_the_whole_clip():
    s = _settings("qwen3", patch_size=16, min_pixels=128 * 32 * 32, max_pixels=768 * 32 * 32)
    # 8 x 480 x 640 > 786432: beta = sqrt(8 * 480 * 640 / 786432) = 1.768; floor(480 / beta / 32) = 8,
    # floor(640 / beta / 32) = 11
    assert frame_size(s, 8, 480, 640) == (256, 352)
    # 20 x 30 is under one merged patch: scaled by 1.6 to 32 x 48, then 8 x 32 x 64 < 131072: beta =
    # sqrt(131072 / (8 * 32 * 48)) = 3.266; ceil(32 * beta / 32) = 4, ceil(48 * beta / 32) = 5
    assert frame_size(s, 8, 20, 30) == (128, 160)
    assert frame_size(s, 2, 480, 640) == (480, 640)  # 2 x 480 x 640 within the bounds: rounded only
    # negative control: Qwen2's per-frame rule gives another size for the same clip
    assert frame_size(_settings("qwen2", patch_size=16, min_pixels=s.min_pixels, max_pixels=s.max_pixels),
                      8, 480, 640) != (256, 352)


# ------------------------------------------------------------------ pixels
def _image_rows(processor, frame, height, width):
    """The family's image processor on one frame, its resize rule's answer replaced by the clip's frame size (the
    video rule's; the image processor then resizes, rescales, normalizes and patchifies it itself):
    [h*w patches, C, T, p, p]."""
    from unittest import mock

    from transformers import Qwen2VLImageProcessorPil

    ip, s = processor.image_processor, video_settings_of(processor)
    image = Qwen2VLImageProcessorPil(patch_size=ip.patch_size, merge_size=ip.merge_size,
                                     temporal_patch_size=ip.temporal_patch_size, image_mean=list(s.image_mean),
                                     image_std=list(s.image_std))
    with mock.patch("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl.smart_resize",
                    lambda *args, **kwargs: (height, width)):
        out = image(images=[frame], return_tensors="pt")
    assert out["image_grid_thw"].tolist() == [[1, height // ip.patch_size, width // ip.patch_size]]
    p = ip.patch_size
    return out["pixel_values"].reshape(-1, 3, ip.temporal_patch_size, p, p)


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen3-vl"])
def test_clip_pixels_are_the_image_processors_frames_in_the_video_patch_order(family, processors, tmp_path):
    processor = processors[family]
    s = video_settings_of(processor)
    path = write_clip(str(tmp_path / "c.mp4"), frames=12, height=84, width=112, fps=4)
    header = clip_header(path)
    indices = sample_indices(s, header.frames, header.fps)
    frames = decode_frames(path, indices)
    pixels, grid = clip_pixels(s, frames)
    height, width = frame_size(s, len(indices), header.height, header.width)
    assert (height, width) != (header.height, header.width)  # the frames are resized
    t, gh, gw = grid
    assert t == -(-len(indices) // 2) and pixels.shape == (t * gh * gw, 3 * 2 * s.patch_size ** 2)
    rows = pixels.reshape(t, gh * gw, 3, 2, s.patch_size, s.patch_size)
    padded = list(frames) + [frames[-1]] * (2 * t - len(frames))
    for k in range(t):
        for slot in range(2):
            want = _image_rows(processor, padded[2 * k + slot], height, width)[:, :, 0]
            torch.testing.assert_close(rows[k, :, :, slot], want, rtol=0, atol=1e-6)
    # negative control: the two frames of a temporal patch swapped are not the processor's clip
    swapped = _image_rows(processor, padded[1], height, width)[:, :, 0]
    assert not torch.allclose(rows[0, :, :, 0], swapped, atol=1e-3)


def test_a_still_clip_is_its_image(processors, tmp_path):
    """Every frame the same: the clip's rows are the image processor's rows of that image (T copies of it)."""
    processor = processors["qwen2-vl"]
    s = video_settings_of(processor)
    still = np.full((4, 48, 64, 3), 77, np.uint8)
    still[:, 10:20, 5:40] = (200, 30, 90)
    pixels, grid = clip_pixels(s, still)
    height, width = frame_size(s, 4, 48, 64)
    want = _image_rows(processor, still[0], height, width).reshape(-1, pixels.shape[1])
    torch.testing.assert_close(pixels[: grid[1] * grid[2]], want, rtol=0, atol=1e-6)


# ------------------------------------------------------------------ the index and the encoding
@pytest.mark.parametrize("family", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3.5"])
def test_index_ids_are_the_encoded_ids(family, processors, tmp_path, monkeypatch):
    processor = processors[family]
    path = messages_rows(str(tmp_path), parts=family == "qwen3-vl")
    decoded = []
    import ds_hetero.sft_data.clips as clips

    real = clips.decode_frames
    monkeypatch.setattr(clips, "decode_frames", lambda p, i: decoded.append(os.path.basename(p)) or real(p, i))
    dataset = SFTDataset.from_file(path, processor).prepare()
    # the rules' checks: the first row with videos and the first with images (row 1, a clip beside its image)
    # are encoded for real; no other clip is decoded
    assert decoded == ["clip0_0.mp4", "clip1_0.mp4"], decoded
    assert len(dataset) == len(VIDEO_ROWS)
    video_id = processor.video_token_id
    for i, (clips_of_row, images, _) in enumerate(VIDEO_ROWS):
        sample = dataset[i]  # raises on a mismatch with the index; compared explicitly too
        assert torch.equal(sample["input_ids"], dataset.input_ids(i))
        assert (sample["labels"][sample["input_ids"] == video_id] == -100).all()
        if not clips_of_row:
            assert "pixel_values_videos" not in sample
            continue
        grids = sample["video_grid_thw"]
        assert grids.shape == (len(clips_of_row), 3)
        assert sample["pixel_values_videos"].shape[0] == int(grids.prod(-1).sum())
        assert int((sample["input_ids"] == video_id).sum()) == int(grids.prod(-1).sum()) // 4
        if family == "qwen2.5-vl":  # 2 frames a temporal patch / the sampled frame rate
            for (frames, _, _, fps), seconds in zip(clips_of_row, sample["second_per_grid_ts"].tolist()):
                kept = len(sample_indices(video_settings_of(processor), frames, fps))
                assert seconds == pytest.approx(2 / (kept / frames * fps))
        else:
            assert "second_per_grid_ts" not in sample
    adapter_checks(family, dataset)


def adapter_checks(family, dataset):
    """The samples pass the family's own sample checks (placeholder runs, grids and patches agree)."""
    from ds_hetero.families import adapter_for

    adapter = adapter_for(family_named(family).tiny())
    for i in range(len(dataset)):
        adapter.check_sample(dataset[i], i)


def test_a_clip_changed_after_the_index_is_named(processors, tmp_path):
    path = messages_rows(str(tmp_path))
    dataset = SFTDataset.from_file(path, processors["qwen2-vl"]).prepare()
    write_clip(str(tmp_path / "clip1_0.mp4"), frames=16, height=112, width=112, fps=4)  # was 56 x 56
    with pytest.raises(BadRowError, match=r"videos.jsonl: row 1 \(line 2\): its encoding .* differs from its length "
                                          r"index entry") as err:
        dataset[1]
    assert dataset.index_folder in str(err.value)
    dataset[0]  # negative control: an unchanged row still matches


def _bad(tmp_path):
    """Rows 1-4 bad: a missing clip, bytes that are no video, a container without frames, one frame."""
    import av

    good = messages_rows(str(tmp_path), rows=VIDEO_ROWS[:1])
    (tmp_path / "garbage.mp4").write_bytes(b"not a video" * 20)
    with av.open(str(tmp_path / "empty.mp4"), "w") as out:
        stream = out.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        out.start_encoding()  # the header written, no frame
    write_clip(str(tmp_path / "one.mp4"), frames=1, height=32, width=32)
    row = json.loads(open(good).readline())
    lines = [row] + [{**row, "videos": [name]} for name in ("missing.mp4", "garbage.mp4", "empty.mp4", "one.mp4")]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return str(path)


BAD_REASONS = ["missing.mp4 does not exist", "garbage.mp4 cannot be read", "empty.mp4 has no",
               "one.mp4 has 1 frame(s): fewer than one temporal patch"]


def test_bad_clips_are_named_and_skippable(processors, tmp_path):
    path = _bad(tmp_path)
    with pytest.raises(BadRowError, match=r"bad.jsonl: row 1 \(line 2\): video .*missing.mp4 does not exist"):
        SFTDataset.from_file(path, processors["qwen2-vl"]).prepare()
    dataset = SFTDataset.from_file(path, processors["qwen2-vl"], skip_bad_rows=True).prepare()
    assert len(dataset) == 1 and [e.row for e in dataset.skipped] == [1, 2, 3, 4]
    for err, words in zip(dataset.skipped, BAD_REASONS):
        assert words in str(err) and err.file == path, (str(err), words)
    dataset[0]


def test_a_processor_that_reads_no_video_names_the_row(tmp_path):
    from ds_hetero.toy import tiny_llava
    from ds_hetero.toy.processors import tiny_processor

    path = messages_rows(str(tmp_path), rows=VIDEO_ROWS[:3])
    dataset = SFTDataset.from_file(path, tiny_processor(tiny_llava("clip", seed=0)), skip_bad_rows=True).prepare()
    assert len(dataset) == 1 and [e.row for e in dataset.skipped] == [0, 1]  # the text-only row is kept
    assert "LlavaProcessor reads none here" in str(dataset.skipped[0])


def test_a_truncated_clip_is_named_at_its_header(tmp_path):
    path = write_clip(str(tmp_path / "c.mkv"), frames=12, height=48, width=48, container="matroska")
    assert clip_header(path).frames == 12  # Matroska stores no frame count: the packets are counted
    shutil.copy(path, tmp_path / "cut.mkv")
    with open(tmp_path / "cut.mkv", "r+b") as f:
        f.truncate(os.path.getsize(path) * 2 // 3)
    assert clip_header(str(tmp_path / "cut.mkv")).frames < 12  # fewer packets: fewer frames to sample
    mp4 = write_clip(str(tmp_path / "c.mp4"), frames=12, height=48, width=48)
    with open(mp4, "r+b") as f:
        f.truncate(os.path.getsize(mp4) - 200)  # the index (moov) at the end is cut
    with pytest.raises(ValueError, match="c.mp4"):
        clip_header(mp4)


def test_the_shipped_clips_are_read(processors, tmp_path):
    """recipes/data/shapes_videos.jsonl and clips/ are make_shapes_clips.py's output (the same bytes, with the
    pinned PyAV): 24 rows, 12 with clips (two in one row, a clip beside an image), 4 clips under 50 KB; the
    index's ids are their encodings'."""
    import importlib.util

    data = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "recipes", "data")
    clips = [os.path.join(data, "clips", n) for n in sorted(os.listdir(os.path.join(data, "clips")))]
    assert len(clips) == 4 and sum(os.path.getsize(c) for c in clips) < 50_000
    spec = importlib.util.spec_from_file_location("make_shapes_clips", os.path.join(data, "make_shapes_clips.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shutil.copy(os.path.join(data, "shapes_messages.jsonl"), tmp_path)  # the image rows it takes
    script.main(["--out", str(tmp_path)])
    for name in ["shapes_videos.jsonl", *[os.path.relpath(c, data) for c in clips]]:
        with open(tmp_path / name, "rb") as f, open(os.path.join(data, name), "rb") as g:
            assert f.read() == g.read(), name
    dataset = SFTDataset.from_file(os.path.join(data, "shapes_videos.jsonl"), processors["qwen2-vl"],
                                   index_dir=None).prepare()
    assert len(dataset) == 24 and not dataset.skipped
    with_clips = [i for i in range(24) if dataset.row(i).videos]
    assert len(with_clips) == 12 and any(len(dataset.row(i).videos) == 2 for i in with_clips)
    for i in with_clips:
        sample = dataset[i]
        assert torch.equal(sample["input_ids"], dataset.input_ids(i)) and sample["video_grid_thw"][:, 0].min() >= 2
