"""The length index (sft_data/length_index.py, index_build.py): sizes from text and image headers, no pixels.

Pure: one process. What each test shows:
- the index's ids are the real encoding's ids, row for row (LLaVA's fixed count, Qwen2-VL's smart resize);
- preparing decodes no image beyond the one row that checks the family's rule (negative control: a
  processor without a rule decodes every image row);
- a wrong rule is caught by that check and every row is then measured by encoding: still exact;
- the cache is read back without measuring, and a changed file or processor setting builds a new one;
- an image changed after the index raises naming the row and the index folder;
- rows that cannot be read (non-UTF-8 bytes, truncated PNG / JPEG) are named by file, row and line at index
  time and skipped under skip_bad_rows; an image broken only past its header is named when decoded, and
  the message then advises fixing the row, never the skip option (which could not have left it out);
- too few rows for one global batch names the file.
"""

import json
import os
import shutil

import pytest
import torch
from PIL import Image, ImageFile

from ds_hetero.sft_data import BadRowError, SFTDataset
from ds_hetero.sft_data.dataset import LATE_ADVICE
from ds_hetero.sft_data.rows import SKIP_ADVICE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "recipes", "data")


@pytest.fixture(scope="module")
def llava():
    from ds_hetero.toy import tiny_llava
    from ds_hetero.toy.processors import tiny_processor

    return tiny_processor(tiny_llava("clip", seed=0))


@pytest.fixture(scope="module")
def qwen():
    from ds_hetero.toy import tiny_qwen2_vl
    from ds_hetero.toy.processors import tiny_processor

    return tiny_processor(tiny_qwen2_vl(seed=0))


@pytest.fixture
def data(tmp_path):
    """A private copy of the shipped rows and images: tests change images and write index folders."""
    shutil.copytree(os.path.join(DATA, "images"), tmp_path / "images")
    shutil.copy(os.path.join(DATA, "shapes_messages.jsonl"), tmp_path / "rows.jsonl")
    return tmp_path


@pytest.fixture
def decodes(monkeypatch):
    """The image files whose pixels were decoded (PIL's ImageFile.load: every format plugin decodes through it)."""
    files: set[str] = set()
    load = ImageFile.ImageFile.load

    def counting(self):
        files.add(os.path.basename(getattr(self, "filename", "") or "?"))
        return load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counting)
    return files


def _images(dataset) -> set[str]:
    return {os.path.basename(p) for i in range(len(dataset)) for p in dataset.row(i).images}


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_index_ids_are_the_encoded_ids(family, request, data):
    processor = request.getfixturevalue(family)
    dataset = SFTDataset.from_file(str(data / "rows.jsonl"), processor).prepare()
    assert len(dataset) == 48
    for i in range(len(dataset)):
        # __getitem__ itself raises on a mismatch; compare explicitly all the same
        assert torch.equal(dataset[i]["input_ids"], dataset.light(i)["input_ids"]), i
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    assert sum(int((dataset.light(i)["input_ids"] == image_id).sum()) for i in range(48)) > 0


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_prepare_decodes_only_the_rule_check(family, request, data, decodes, monkeypatch):
    processor = request.getfixturevalue(family)
    SFTDataset.from_file(str(data / "rows.jsonl"), processor, index_dir=None).prepare()
    assert len(decodes) == 1  # the first image row, encoded to check the family's rule
    # negative control: with no rule known for the processor every image row is decoded
    import ds_hetero.families as families

    monkeypatch.setattr(families, "image_token_rule", lambda processor: None)
    decodes.clear()
    dataset = SFTDataset.from_file(str(data / "rows.jsonl"), processor, index_dir=None).prepare()
    assert decodes == _images(dataset) and len(decodes) > 1


def test_a_wrong_rule_falls_back_to_encoding(qwen, data, monkeypatch):
    import ds_hetero.families as families

    monkeypatch.setattr(families, "image_token_rule", lambda processor: (lambda h, w: 1))
    dataset = SFTDataset.from_file(str(data / "rows.jsonl"), qwen, index_dir=None).prepare()
    for i in range(len(dataset)):
        assert torch.equal(dataset[i]["input_ids"], dataset.light(i)["input_ids"]), i


def test_the_cache_is_reused_and_keyed(llava, qwen, data, decodes):
    path = str(data / "rows.jsonl")
    lines = []
    first = SFTDataset.from_file(path, llava)
    first.log = lines.append
    first.prepare()
    assert first.index_folder.startswith(str(data / ".ds_hetero_index")) and os.path.isdir(first.index_folder)
    assert len(lines) == 1 and "48 rows measured" in lines[0]
    decodes.clear()
    again = SFTDataset.from_file(path, llava)
    again.log = lines.append
    again.prepare()
    assert not decodes and len(lines) == 1 and again.index_folder == first.index_folder
    assert [again.input_ids(i).tolist() for i in range(48)] == [first.input_ids(i).tolist() for i in range(48)]
    # another processor, another processor setting, other content: other folders
    assert SFTDataset.from_file(path, qwen).prepare().index_folder != first.index_folder
    from ds_hetero.toy import tiny_qwen2_vl
    from ds_hetero.toy.processors import tiny_qwen2_vl_processor

    bigger = tiny_qwen2_vl_processor(tiny_qwen2_vl(seed=0), max_pixels=32 * 32)
    assert (SFTDataset.from_file(path, bigger).prepare().index_folder !=
            SFTDataset.from_file(path, qwen).prepare().index_folder)
    with open(path, "a") as f:
        f.write(open(path).readline())
    grown = SFTDataset.from_file(path, llava).prepare()
    assert len(grown) == 49 and grown.index_folder != first.index_folder


def test_an_image_changed_after_the_index_is_named(qwen, data):
    dataset = SFTDataset.from_file(str(data / "rows.jsonl"), qwen).prepare()
    i = next(i for i in range(len(dataset)) if dataset.row(i).images)
    row = dataset.row(i)
    Image.new("RGB", (64, 48), "red").save(row.images[0])  # another size: another token count
    with pytest.raises(BadRowError) as err:
        dataset[i]
    message = str(err.value)
    assert f"row {row.index} (line {row.index + 1})" in message and "differs from its length index" in message
    assert dataset.index_folder in message


def _rows_with(data, bad_line: bytes) -> str:
    path = data / "mixed.jsonl"
    good = open(data / "rows.jsonl", "rb").readlines()
    path.write_bytes(b"".join(good[:3]) + bad_line + b"".join(good[3:6]))
    return str(path)


def _broken_png(data) -> str:
    blob = (data / "images" / "000.png").read_bytes()
    (data / "images" / "cut.png").write_bytes(blob[: len(blob) // 2])
    return "images/cut.png"


def _broken_jpeg(data) -> str:
    Image.effect_noise((96, 64), 40).convert("RGB").save(data / "images" / "whole.jpg")
    blob = (data / "images" / "whole.jpg").read_bytes()
    (data / "images" / "cut.jpg").write_bytes(blob[: len(blob) // 2])
    return "images/cut.jpg"


def _image_line(image: str) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "<image> what is here ?"},
                                    {"role": "assistant", "content": "a red circle"}],
                       "images": [image]}).encode() + b"\n"


BROKEN = {
    "non-UTF-8 bytes": (lambda data: b'{"messages": "caf\xe9"}\n', "not UTF-8"),
    "truncated PNG": (lambda data: _image_line(_broken_png(data)), "cut.png"),
    "truncated JPEG": (lambda data: _image_line(_broken_jpeg(data)), "cut.jpg"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_unreadable_rows_are_named_at_index_time_and_skippable(case, llava, data, decodes):
    make, words = BROKEN[case]
    path = _rows_with(data, make(data))
    with pytest.raises(BadRowError) as err:
        SFTDataset.from_file(path, llava).prepare()
    message = str(err.value)
    assert words in message and f"{path}: row 3 (line 4)" in message and "--skip-bad-rows" in message, message
    decodes.clear()
    dataset = SFTDataset.from_file(path, llava, skip_bad_rows=True).prepare()
    assert len(dataset) == 6 and [e.row for e in dataset.skipped] == [3]
    assert [dataset.row(i).index for i in range(6)] == [0, 1, 2, 4, 5, 6]
    assert not decodes & {"cut.png", "cut.jpg"}  # found from the header alone


def test_an_image_broken_past_its_header_is_named_without_advising_skip(llava, data):
    dataset = SFTDataset.from_file(str(data / "rows.jsonl"), llava, skip_bad_rows=True).prepare()
    i = next(i for i in range(len(dataset)) if dataset.row(i).images)
    (data / dataset.row(i).images[0]).write_bytes(b"not an image any more")
    with pytest.raises(BadRowError) as err:
        dataset[i]
    assert LATE_ADVICE in str(err.value) and SKIP_ADVICE not in str(err.value)
    plain = SFTDataset.from_file(str(data / "rows.jsonl"), llava, index_dir=None)
    plain.index = dataset.index  # bad rows not skipped: skipping would not have left this row out either
    with pytest.raises(BadRowError) as err:
        plain[i]
    assert LATE_ADVICE in str(err.value) and SKIP_ADVICE not in str(err.value)
    dataset[i - 1 if i else i + 1]  # negative control: the other rows still encode


def test_too_few_rows_names_the_file(llava, data):
    from ds_hetero.data.loader import GlobalBatchLoader

    path = _rows_with(data, b"")
    dataset = SFTDataset.from_file(path, llava).prepare()
    with pytest.raises(ValueError, match=rf"training_data \({path}\) has 6 usable samples, fewer than one global"):
        GlobalBatchLoader(dataset, 8)
    assert GlobalBatchLoader(dataset, 6).steps_per_epoch == 1
