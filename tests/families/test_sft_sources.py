"""Where real rows come from (ds_hetero/sft_data/sources.py): Hugging Face datasets with an Image column,
`save_to_disk` folders, `load_dataset("json")`, folders of JSONL shards.

Pure: no processes. Each source is checked against the same rows read from a JSONL file and image
files, the path already checked by test_sft_data.py: same expanded ids in the length index, same
encoded samples, same pixels.
"""

import io
import json
import os
import pickle

import pytest
import torch
from PIL import Image

from ds_hetero.sft_data import BadRowError, SFTDataset
from ds_hetero.sft_data import sources
from ds_hetero.sft_data.image_headers import EmbeddedImage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "recipes", "data")
MESSAGES = os.path.join(DATA, "shapes_messages.jsonl")
ROWS = 8  # of the shipped 48: enough for every kind of row, quick to encode
SIZES = [(32, 32), (48, 40), (24, 64), (96, 56)]  # (w, h) cycled over rows: the token counts differ


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


def _shipped_rows(n=ROWS):
    with open(MESSAGES) as f:
        return [json.loads(line) for line in f][:n]


def _trl_messages(row):
    """A messages row with string content -> TRL's content parts ({"type": "image"}, {"type": "text"})."""
    out = []
    for m in row["messages"]:
        parts = []
        for k, piece in enumerate(m["content"].split("<image>")):
            if k:
                parts.append({"type": "image", "text": None})
            if piece.strip():
                parts.append({"type": "text", "text": piece.strip()})
        out.append({"role": m["role"], "content": parts})
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(JSONL file with image files, the same rows as a datasets.Dataset with an Image column, its PIL images)."""
    import datasets

    folder = tmp_path_factory.mktemp("pair")
    rows, pil_rows = [], []
    for i, row in enumerate(_shipped_rows()):
        images = []
        for k, name in enumerate(row["images"]):
            with Image.open(os.path.join(DATA, name)) as im:
                resized = im.convert("RGB").resize(SIZES[(i + k) % len(SIZES)])
            path = folder / f"{i}_{k}.png"
            resized.save(path)
            images.append(resized)
        pil_rows.append(images)
        rows.append({**row, "images": [f"{i}_{k}.png" for k in range(len(images))]})
    jsonl = folder / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    features = datasets.Features({
        "images": datasets.List(datasets.Image()),
        "messages": datasets.List({"role": datasets.Value("string"),
                                   "content": datasets.List({"type": datasets.Value("string"),
                                                             "text": datasets.Value("string")})})})
    hf = datasets.Dataset.from_dict({"images": pil_rows, "messages": [_trl_messages(r) for r in rows]},
                                    features=features)
    return str(jsonl), hf


def _same_samples(a: SFTDataset, b: SFTDataset):
    assert len(a) == len(b)
    for i in range(len(a)):
        x, y = a[i], b[i]  # __getitem__ also checks each encoding against its own index entry
        assert torch.equal(a.input_ids(i), b.input_ids(i)), i
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"]), i
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), i


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_image_column_gives_the_file_samples(family, request, pair, tmp_path):
    import datasets

    processor = request.getfixturevalue(family)
    jsonl, hf = pair
    assert isinstance(hf.features["images"].feature, datasets.Image)
    raw = sources.open_source(hf).raw(0)
    assert isinstance(raw.obj["images"][0], EmbeddedImage) and "bytes in the dataset" in str(raw.obj["images"][0])
    from_file = SFTDataset.from_file(jsonl, processor, index_dir=str(tmp_path / "a"))
    from_hf = SFTDataset.from_dataset(hf, processor, image_folder="", index_dir=str(tmp_path / "b")).prepare()
    _same_samples(from_file, from_hf)
    lengths = {from_hf.input_ids(i).numel() for i in range(len(from_hf))}
    assert len(lengths) > 2  # the sizes differ, so the rule's token counts do (the check is not vacuous)


def test_prepare_decodes_no_pixels(pair, qwen, tmp_path, monkeypatch):
    """The index reads image headers: the one row it encodes is the family rule's check (once per part)."""
    _, hf = pair
    from PIL import ImageFile

    decoded = {}  # id -> size of each image decoded (convert() loads, then copies: load runs twice)
    real_load = ImageFile.ImageFile.load  # decoding an encoded image (Image.Image.load also runs on new ones)

    def counting_load(self, *a, **kw):
        decoded[id(self)] = self.size
        return real_load(self, *a, **kw)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counting_load)
    data = SFTDataset.from_dataset(hf, qwen, image_folder="", index_dir=str(tmp_path)).prepare()
    assert len(decoded) == 1 and len(data) == ROWS  # the rule's check of the first image row, nothing else
    decoded.clear()
    again = SFTDataset.from_dataset(hf, qwen, image_folder="", index_dir=str(tmp_path)).prepare()
    assert not decoded and len(again) == ROWS  # the cached index: nothing measured, nothing decoded
    again[3]  # negative control: encoding a row decodes its image, and the patch sees it
    assert list(decoded.values()) == [SIZES[3]]


def test_saved_folder_opens_with_load_from_disk(pair, llava, tmp_path):
    import datasets

    jsonl, hf = pair
    saved = tmp_path / "saved"
    hf.save_to_disk(str(saved))
    data = SFTDataset.from_file(str(saved), llava).prepare()
    assert isinstance(data.source, sources.DatasetSource) and data.source.dataset.cache_files  # memory-mapped
    assert data.source.fingerprint() == f"arrow-{datasets.load_from_disk(str(saved))._fingerprint}"
    assert os.path.isdir(saved / ".ds_hetero_index")  # the index beside the rows, as for a JSONL folder
    _same_samples(data, SFTDataset.from_file(jsonl, llava, index_dir=str(tmp_path / "file")))
    assert len(datasets.load_from_disk(str(saved))) == ROWS  # the index folder does not disturb datasets

    datasets.DatasetDict({"train": hf}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(ValueError, match=r"a DatasetDict folder; give one split's folder, e.g. .*dict/train"):
        SFTDataset.from_file(str(tmp_path / "dict"), llava)
    with pytest.raises(ValueError, match=r"a DatasetDict \(splits train\): give one split, e.g. data\['train'\]"):
        SFTDataset.from_dataset(datasets.DatasetDict({"train": hf}), llava, image_folder="")


def test_load_dataset_json_and_image_paths(llava, tmp_path):
    """load_dataset("json") rows (image paths as strings), and an Image column stored as paths (no bytes)."""
    import datasets

    rows = _shipped_rows()
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    want = SFTDataset.from_file(str(path), llava, image_folder=DATA, index_dir=str(tmp_path / "w"))
    js = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    _same_samples(want, SFTDataset.from_dataset(js, llava, image_folder=DATA, index_dir=str(tmp_path / "j")))

    by_path = datasets.Dataset.from_dict({
        "images": [[os.path.join(DATA, p) for p in r["images"]] for r in rows],
        "messages": [r["messages"] for r in rows]}).cast_column("images", datasets.List(datasets.Image()))
    assert sources.open_source(by_path).raw(0).obj["images"] == [os.path.join(DATA, rows[0]["images"][0])]
    _same_samples(want, SFTDataset.from_dataset(by_path, llava, image_folder="", index_dir=str(tmp_path / "p")))


def _broken(kind: str) -> bytes:
    im = Image.new("RGB", (40, 30), (200, 10, 10))
    buffer = io.BytesIO()
    im.save(buffer, "JPEG" if kind == "jpeg" else "PNG")
    data = buffer.getvalue()
    return {"png": data[: len(data) // 2], "jpeg": data[:-2], "junk": b"not an image at all",
            "good": data}[kind]


def test_corrupt_image_bytes_named_and_skippable(pair, llava, tmp_path):
    import datasets

    _, hf = pair
    good = hf.select_columns(["messages"])[:4]  # no image column: nothing decoded
    kinds = ["good", "png", "good", "jpeg", "junk"]
    images = [[{"bytes": _broken(k), "path": None}] for k in kinds]
    messages = [good["messages"][i % 4] for i in range(len(kinds))]
    broken = datasets.Dataset.from_dict({"images": images, "messages": messages},
                                        features=hf.features)
    with pytest.raises(BadRowError) as err:
        SFTDataset.from_dataset(broken, llava, image_folder="", index_dir=None).prepare()
    message = str(err.value)
    assert err.value.row == 1 and "images[0] (" in message and "bytes in the dataset) cannot be read" in message
    assert "--skip-bad-rows" in message
    data = SFTDataset.from_dataset(broken, llava, image_folder="", skip_bad_rows=True, index_dir=None).prepare()
    assert len(data) == 2 and [e.row for e in data.skipped] == [1, 3, 4]  # negative control: good bytes pass
    assert "truncated (no JPEG end-of-image marker)" in data.skipped[1].reason
    assert data[1]["input_ids"].numel() == data.input_ids(1).numel()  # a kept row still encodes from its bytes


def _shard(tmp_path, sizes, order=None):
    with open(MESSAGES) as f:
        lines = f.readlines()
    folder = tmp_path / ("shards" if order is None else "swapped")
    folder.mkdir()
    start, pieces = 0, []
    for n in sizes:
        pieces.append(lines[start:start + n])
        start += n
    for k, j in enumerate(order or range(len(pieces))):
        (folder / f"part-{k:05d}.jsonl").write_text("".join(pieces[j]))
    return str(folder)


def test_shards_read_a_row_at_a_time_and_equal_one_file(llava, tmp_path, monkeypatch):
    folder = _shard(tmp_path, [5, 20, 23])

    def no_parse(data):
        raise AssertionError("a row was parsed while opening the source")

    with monkeypatch.context() as m:  # opening scans line starts only: no row is parsed or kept
        m.setattr(sources, "_decode_line", no_parse)
        source = sources.open_source(folder)
    state = len(pickle.dumps(source))  # what a data worker gets: offsets, not rows
    assert state < sum(os.path.getsize(p) for p in source.paths) / 2
    raw = source.raw(27)  # the third shard's rows start at global row 25
    assert raw.file.endswith("part-00002.jsonl") and raw.row == 2 and raw.line == 3

    one = SFTDataset.from_file(MESSAGES, llava, index_dir=str(tmp_path / "one"))
    shards = SFTDataset.from_file(folder, llava, image_folder=DATA, index_dir=str(tmp_path / "idx"))
    assert len(one) == len(shards) == 48
    assert all(torch.equal(one.input_ids(i), shards.input_ids(i)) for i in range(48))
    # a resumed run opens the source again and reads from the cached index, inside a shard: same rows
    resumed = SFTDataset.from_file(folder, llava, image_folder=DATA, index_dir=str(tmp_path / "idx"))
    for i in (3, 4, 5, 17, 24, 25, 47):
        assert resumed.raw(i).obj == one.raw(i).obj and torch.equal(resumed[i]["input_ids"], one[i]["input_ids"])

    swapped = _shard(tmp_path, [5, 20, 23], order=[1, 0, 2])  # negative control: shard order is the row order
    other = SFTDataset.from_file(swapped, llava, image_folder=DATA, index_dir=str(tmp_path / "sw"))
    assert not all(torch.equal(one.input_ids(i), other.input_ids(i)) for i in range(48))
