"""The real-data path (ds_hetero/sft_data): both file formats, the label masking, every bad row, the skip count.

Pure: no processes. The tiny models' processors (built locally) encode; the expected labels are
built independently from the word-level tokenizer: each assistant turn's words plus its `</s>`, nothing else.
"""

import json
import os
import shutil

import pytest
import torch

from ds_hetero.sft_data import BadRowError, SFTDataset, read_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "recipes", "data")
LLAVA_JSON, MESSAGES = os.path.join(DATA, "shapes_llava.json"), os.path.join(DATA, "shapes_messages.jsonl")


@pytest.fixture(scope="module")
def llava():
    from ds_hetero.toy import tiny_llava
    from ds_hetero.toy.processors import tiny_processor

    model = tiny_llava("clip", seed=0)
    return model, tiny_processor(model)


@pytest.fixture(scope="module")
def qwen():
    from ds_hetero.toy import tiny_qwen2_vl
    from ds_hetero.toy.processors import tiny_processor

    model = tiny_qwen2_vl(seed=0)
    return model, tiny_processor(model)


@pytest.fixture(scope="module")
def qwen25():
    from ds_hetero.families.meta import builtin_model
    from ds_hetero.toy.processors import tiny_processor

    model = builtin_model("tiny-qwen2.5-vl", seed=0)  # the recipe's --model-family qwen2.5-vl
    return model, tiny_processor(model)


LATE_IMAGE = {"messages": [{"role": "user", "content": "<image> what is here ?"},
                           {"role": "assistant", "content": "a red circle"},
                           {"role": "user", "content": "and <image> what is here ?"},
                           {"role": "assistant", "content": "a blue square at the top left"}],
              "images": ["images/000.png", "images/001.png"]}


def _late_image_rows(tmp_path):
    """The shipped rows 0, 4, 5, 7 and a row whose second image follows an assistant turn."""
    with open(MESSAGES) as f:
        lines = f.readlines()
    path = tmp_path / "late_image.jsonl"
    path.write_text("".join(lines[i] for i in (0, 4, 5, 7)) + json.dumps(LATE_IMAGE) + "\n")
    return str(path)


def _expected_labels(row, tokenizer):
    """The label tokens in order: every assistant turn's text and its end-of-turn </s>."""
    want = []
    for t in row.turns:
        if t.role == "assistant":
            want += tokenizer(" ".join(p for k, p in t.parts if k == "text") + " </s>",
                              add_special_tokens=False)["input_ids"]
    return want


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_both_formats_give_the_same_samples(family, request):
    model, processor = request.getfixturevalue(family)
    a, b = SFTDataset.from_file(LLAVA_JSON, processor), SFTDataset.from_file(MESSAGES, processor)
    assert len(a) == len(b) == 48 and not a.skipped and not b.skipped
    image_id = model.config.image_token_id
    kinds = set()
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), i
        n_images = len(a.row(i).images)
        kinds.add((n_images, sum(t.role == "assistant" for t in a.row(i).turns)))
        assert ("pixel_values" in x) == (n_images > 0)
        if family == "qwen" and n_images:
            assert x["image_grid_thw"].shape == (n_images, 3)
            assert int((x["input_ids"] == image_id).sum()) == int(x["image_grid_thw"].prod(-1).sum()) // 4
        elif n_images:
            assert x["pixel_values"].shape[0] == n_images
            assert int((x["input_ids"] == image_id).sum()) == 16 * n_images  # (32 / 8)^2 per image
    assert kinds == {(1, 1), (1, 2), (2, 1), (0, 1)}  # one image, two turns, two images, text only
    assert torch.equal(a.input_ids(3), a[3]["input_ids"])


def _label_errors(data, model, processor) -> list[str]:
    """What is wrong with each sample's labels: anything but exactly its assistant turns' tokens."""
    errors = []
    for i in range(len(data)):
        s, row = data[i], data.row(i)
        labels, ids = s["labels"], s["input_ids"]
        kept = labels != -100
        words = processor.tokenizer.convert_ids_to_tokens(ids[~kept].tolist())  # the unlabelled tokens
        checks = {
            "a label is not its own token": torch.equal(labels[kept], ids[kept]),  # (the model shifts)
            "not the assistant turns' tokens": labels[kept].tolist() == _expected_labels(row, processor.tokenizer),
            "an image token labelled": not kept[ids == model.config.image_token_id].any(),
            "a header labelled": words.count("assistant") == sum(t.role == "assistant" for t in row.turns),
            "a user turn labelled": "what" in words,
        }
        errors += [f"row {i}: {what}" for what, ok in checks.items() if not ok]
    return errors


@pytest.mark.parametrize("family", ["llava", "qwen", "qwen25"])
def test_labels_only_on_assistant_turns(family, request, tmp_path):
    model, processor = request.getfixturevalue(family)
    # one image; two question/answer turns; two images; text only; an image after an answer
    data = SFTDataset.from_file(_late_image_rows(tmp_path), processor, image_folder=DATA)
    assert _label_errors(data, model, processor) == []


def test_label_check_catches_a_shifted_alignment(llava, tmp_path, monkeypatch):
    """Negative control: labels carried onto the expanded ids by one constant shift (right while every image
    precedes every answer) fail on the row whose second image follows an answer."""
    import ds_hetero.sft_data.encode as encode

    def shifted(unexpanded, mask, expanded, row):
        off, labels = len(expanded) - len(unexpanded), [-100] * len(expanded)
        for k, m in enumerate(mask):
            if m:
                labels[k + off] = expanded[k + off]
        return labels

    model, processor = llava
    monkeypatch.setattr(encode, "expand_labels", shifted)
    data = SFTDataset.from_file(_late_image_rows(tmp_path), processor, image_folder=DATA)
    errors = _label_errors(data, model, processor)
    assert errors and all(e.startswith("row 4:") for e in errors), errors


def test_the_model_takes_a_sample(llava):
    model, processor = llava
    s = SFTDataset.from_file(MESSAGES, processor)[0]
    out = model(input_ids=s["input_ids"][None], labels=s["labels"][None], pixel_values=s["pixel_values"])
    assert torch.isfinite(out.loss)


def test_trl_parts_and_llava_image_lists(tmp_path, llava):
    _, processor = llava
    rows = [
        {"messages": [{"role": "system", "content": "what is here ?"},
                      {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is here ?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "a red circle"}]}],
         "images": ["images/000.png"]},
        {"messages": [{"role": "user", "content": "<image>what is here ?"},
                      {"role": "assistant", "content": "a red circle"}], "images": ["images/000.png"]},
        {"image": ["images/000.png", "images/001.png"],
         "conversations": [{"from": "human", "value": "<image> <image> what is here ?"},
                           {"from": "gpt", "value": "a red circle"}]},
    ]
    path = _write(tmp_path, rows, jsonl=False)
    parsed, _ = read_rows(path, image_folder=DATA)
    assert [t.role for t in parsed[0].turns] == ["system", "user", "assistant"]
    assert parsed[0].turns[1:] == parsed[1].turns and parsed[0].images == parsed[1].images
    assert len(parsed[2].images) == 2 and parsed[2].images[1].endswith("001.png")
    data = SFTDataset.from_file(path, processor, image_folder=DATA, index_dir=None)
    assert data[0]["labels"][data[0]["labels"] != -100].tolist() == _expected_labels(parsed[0], processor.tokenizer)


def _write(tmp_path, rows, jsonl=True, name=None):
    path = tmp_path / (name or ("rows.jsonl" if jsonl else "rows.json"))
    with open(path, "w") as f:
        if jsonl:
            f.writelines((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
        else:
            json.dump(rows, f)
    return str(path)


GOOD = {"messages": [{"role": "user", "content": "<image>what is here ?"},
                     {"role": "assistant", "content": "a red circle"}], "images": ["images/000.png"]}
BAD = {
    "missing image": ({**GOOD, "images": ["images/nope.png"]}, "nope.png does not exist"),
    "more placeholders": ({**GOOD, "images": []}, "1 image placeholder(s)"),
    "more images": ({**GOOD, "images": ["images/000.png", "images/001.png"]}, "but 2 image(s)"),
    "empty assistant": ({**GOOD, "messages": [GOOD["messages"][0], {"role": "assistant", "content": "  "}]},
                        "turn 1 is an empty assistant turn"),
    "unknown role": ({**GOOD, "messages": [{"role": "bot", "content": "a"}, *GOOD["messages"]]},
                     "unknown role 'bot'"),
    "llava unknown role": ({"image": "images/000.png", "conversations": [
        {"from": "human", "value": "<image> what"}, {"from": "robot", "value": "a"}]}, "unknown role 'robot'"),
    "no assistant": ({**GOOD, "messages": GOOD["messages"][:1]}, "no assistant turn"),
    "no conversation": ({"text": "a red circle"}, "no 'conversations' (LLaVA format) or 'messages' key"),
    "not json": ("{not json", "not JSON"),
    "video without a placeholder": ({**GOOD, "videos": ["images/000.png"]}, "0 video placeholder(s)"),
    "video part without a file": ({**GOOD, "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "a"}]},
        GOOD["messages"][1]]}, "1 video placeholder(s) (<video> or {'type': 'video'}) but 0 video(s)"),
    "missing video": ({**GOOD, "messages": [{"role": "user", "content": "<image><video>what is here ?"},
                                            GOOD["messages"][1]], "videos": ["nope.mp4"]}, "video /"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_every_bad_row_is_named(tmp_path, case):
    bad, words = BAD[case]
    path = _write(tmp_path, [GOOD, GOOD, bad])
    with pytest.raises(BadRowError) as err:
        read_rows(path, image_folder=DATA)
    message = str(err.value)
    assert words in message and path in message and "row 2 (line 3)" in message, message
    assert "--skip-bad-rows" in message
    assert (err.value.file, err.value.row, err.value.line) == (path, 2, 3)
    rows, skipped = read_rows(path, image_folder=DATA, skip_bad_rows=True)  # negative control: the good rows pass
    assert [r.index for r in rows] == [0, 1] and [s.row for s in skipped] == [2]


def test_json_list_rows_are_named_with_their_lines(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text("[\n" + ",\n".join(json.dumps(r, indent=1) for r in [GOOD, BAD["missing image"][0]]) + "\n]\n")
    first = json.dumps(GOOD, indent=1).count("\n") + 1  # lines of the first row
    with pytest.raises(BadRowError, match=rf"rows.json: row 1 \(line {first + 2}\): image .*nope.png"):
        read_rows(str(path), image_folder=DATA)


def test_skip_bad_rows_counts(tmp_path, llava):
    _, processor = llava
    rows = [GOOD, *[b for b, _ in BAD.values()], GOOD]
    path = _write(tmp_path, rows)
    data = SFTDataset.from_file(path, processor, image_folder=DATA, skip_bad_rows=True)
    assert len(data) == 2 and len(data.skipped) == len(BAD)
    assert [data.row(i).index for i in range(len(data))] == [0, len(rows) - 1]
    assert data.skipped_summary().startswith(f"skipped {len(BAD)} bad row(s) of {path} (first: ")
    only_bad = _write(tmp_path, [b for b, _ in BAD.values()], name="bad.jsonl")
    with pytest.raises(ValueError, match="no usable rows"):
        read_rows(only_bad, image_folder=DATA, skip_bad_rows=True)


def test_image_folder_default_is_the_files_folder(tmp_path):
    shutil.copytree(os.path.join(DATA, "images"), tmp_path / "images")
    path = _write(tmp_path, [GOOD])
    (row,), _ = read_rows(path)
    assert row.images == (str(tmp_path / "images" / "000.png"),)
    with pytest.raises(BadRowError, match="does not exist"):  # the shipped files' paths are not under tmp/other
        read_rows(path, image_folder=str(tmp_path / "other"))


def test_a_template_that_is_not_prefix_stable_is_refused(llava):
    """The label search needs the template to render turns < k as a prefix of turns <= k."""
    _, processor = llava

    class Reversed:  # renders the turns last first: no conversation is a prefix of a longer one
        tokenizer = processor.tokenizer

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            return processor.apply_chat_template(messages[::-1], tokenize=False)

    row = read_rows(MESSAGES)[0][0]
    from ds_hetero.sft_data.encode import assistant_mask

    with pytest.raises(BadRowError, match="prefix by prefix"):
        assistant_mask(row, Reversed())


def test_the_shipped_data_is_what_the_script_makes(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_shapes_sft", os.path.join(DATA, "make_shapes_sft.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--out", str(tmp_path)])
    names = ["shapes_llava.json", "shapes_messages.jsonl", *[f"images/{n}" for n in os.listdir(tmp_path / "images")]]
    assert len(names) == 2 + len(os.listdir(os.path.join(DATA, "images")))
    for name in names:
        with open(tmp_path / name, "rb") as f, open(os.path.join(DATA, name), "rb") as g:
            assert f.read() == g.read(), name
    total = sum(os.path.getsize(os.path.join(DATA, n)) for n in names)
    assert total < 300_000, total


def _recipe():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_llava", os.path.join(ROOT, "recipes", "train_llava.py"))
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe


def test_recipe_refuses_data_for_a_tiny_family_without_processor():
    recipe = _recipe()
    args = recipe.parse_args(["--model-family", "gemma3", "--data", MESSAGES])
    with pytest.raises(SystemExit, match="no processor.*--model PATH"):
        recipe.data_processor(args, model=None)


def test_recipe_data_options_need_data(capsys):
    with pytest.raises(SystemExit):
        _recipe().parse_args(["--image-folder", DATA])
    assert "apply to --data FILE" in capsys.readouterr().err


def test_a_checkpoint_brings_its_own_processor(tmp_path, llava):
    """--model PATH: the processor saved next to the weights (AutoProcessor) encodes as the one it was saved from."""
    model, processor = llava
    processor.save_pretrained(tmp_path)
    recipe = _recipe()
    args = recipe.parse_args(["--model", str(tmp_path), "--data", MESSAGES])
    loaded = recipe.data_processor(args, model)
    assert type(loaded).__name__ == "LlavaProcessor"
    want, got = SFTDataset.from_file(MESSAGES, processor), SFTDataset.from_file(MESSAGES, loaded)
    for i in (0, 5, 7):
        assert want[i].keys() == got[i].keys() and all(torch.equal(want[i][k], got[i][k]) for k in want[i]), i


def test_markers_the_processor_inserts_around_images_carry_no_label(llava, tmp_path):
    """A processor that adds tokens around each image run (as Gemma 3's does: <start_of_image> ... <end_of_image>):
    the labels still sit on the assistant tokens only. Here it inserts <s> and </s>, the latter also the turns'
    end token, so a position-blind alignment would label the wrong copy."""
    model, processor = llava
    image_id, bos, eos = model.config.image_token_id, 1, processor.tokenizer.eos_token_id

    class Bracketing:
        tokenizer = processor.tokenizer
        apply_chat_template = processor.apply_chat_template

        def __call__(self, **kwargs):
            out = processor(**kwargs)
            ids, wrapped = out["input_ids"][0].tolist(), []
            for k, t in enumerate(ids):
                if t == image_id and (k == 0 or ids[k - 1] != image_id):
                    wrapped.append(bos)
                wrapped.append(t)
                if t == image_id and (k + 1 == len(ids) or ids[k + 1] != image_id):
                    wrapped.append(eos)
            return {**out, "input_ids": torch.tensor([wrapped])}

    path = _late_image_rows(tmp_path)
    plain = SFTDataset.from_file(path, processor, image_folder=DATA)
    bracketed = SFTDataset.from_file(path, Bracketing(), image_folder=DATA)
    for i in (0, 1, 2, 4):
        a, b = plain[i], bracketed[i]
        assert len(b["input_ids"]) == len(a["input_ids"]) + 2 * len(plain.row(i).images)
        assert b["labels"][b["labels"] != -100].tolist() == a["labels"][a["labels"] != -100].tolist() \
            == _expected_labels(plain.row(i), processor.tokenizer), i
        # every inserted </s> sits right after an image run and is unlabelled
        after_image = torch.zeros_like(b["input_ids"], dtype=torch.bool)
        after_image[1:] = b["input_ids"][:-1] == image_id
        assert (b["labels"][after_image] == -100).all()
