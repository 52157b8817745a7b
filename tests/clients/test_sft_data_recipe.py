"""The main job's recipe on the shipped real data (recipes/data), 4 ranks, against one HF process.

One 4-rank launch (run_cases) runs recipes/train_llava.py three times, 3 steps each, on the default layout
(vision dp4, language tp2 dp2, 2 micro-batches):
    llava        --data shapes_messages.jsonl
    qwen2-vl     --data (shapes_llava.json + two bad rows) --image-folder recipes/data --skip-bad-rows
    qwen2.5-vl   --data (MP4 clips written with PyAV beside images and text rows, + a row whose clip cannot
                 be read) --skip-bad-rows: the clips decoded in the data path, their frames sampled, resized
                 and patchified by the video processor's rule (docs/video.md)
The first step's loss must equal, within 1e-5 relative, the unmodified single-process HF model's own
loss (`model(**batch).loss`) on the same first global batch (the loader's seeded order), padded by
a plain collator (measured: 6e-9 and 5e-8 relative; the clips' `pixel_values_videos`, `video_grid_thw` and
`second_per_grid_ts` fed to the HF model as the processor emits them). Negative controls: the same reference
with labels on every token, or on the second step's batch, is off by more than 10x the tolerance; for the
clips also the reference fed each clip's temporal patches in reverse order.
"""

import json
import math
import os

import pytest
import torch

from ds_hetero.testing.cases import launch_cases
from tests.helpers.driver_report import load_recipe

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "recipes", "data")
CONFIG = os.path.join(ROOT, "ds_configs", "llava_colocated.json")
REL = 1e-5


def _recipe():
    return load_recipe(ROOT, "train_llava")


def _run_recipe(rank, world_size, argv, out):
    path = f"{out}.rank{rank}.json"
    _recipe().main([*argv, "--steps", "3", "--deepspeed_config", CONFIG, "--summary-json", path])
    if rank == 0:
        with open(path) as f:
            return json.load(f)
    return None


def _with_bad_rows(tmp_path):
    rows = json.load(open(os.path.join(DATA, "shapes_llava.json")))
    rows.insert(3, {"image": "images/missing.png", "conversations": [{"from": "human", "value": "<image> what"},
                                                                      {"from": "gpt", "value": "a"}]})
    rows.append({"conversations": [{"from": "human", "value": "what is here ?"}, {"from": "gpt", "value": ""}]})
    path = tmp_path / "with_bad_rows.json"
    path.write_text(json.dumps(rows))
    return str(path)


def _clips(tmp_path):
    """Clips of 8-16 frames (48x80 to 112x84, 4-8 fps: tests/helpers/video_files.py) beside images and text rows,
    one with two clips, another a clip beside its image, three copies (24 rows); then one row whose clip is not a
    video (skipped). High-contrast frames: at the random init the loss must see a clip's frames reordered."""
    from tests.helpers.video_files import messages_rows

    path = messages_rows(str(tmp_path / "clips"), repeat=3)
    (tmp_path / "clips" / "broken.mp4").write_bytes(b"not a video" * 10)
    with open(path, "a") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "<video> what is here ?"},
                                         {"role": "assistant", "content": "a red circle"}],
                            "videos": ["broken.mp4"]}) + "\n")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft_recipe")
    argv = {
        "llava": ["--data", os.path.join(DATA, "shapes_messages.jsonl")],
        "qwen2-vl": ["--model-family", "qwen2-vl", "--data", _with_bad_rows(tmp), "--image-folder", DATA,
                     "--skip-bad-rows"],
        "qwen2.5-vl videos": ["--model-family", "qwen2.5-vl", "--data", _clips(tmp), "--skip-bad-rows"],
    }
    cases = {name: (_run_recipe, {"argv": a, "out": str(tmp / name)}) for name, a in argv.items()}
    results = launch_cases(cases, world_size=4, timeout=900)
    return {name: (argv[name], results[name][0]) for name in argv}


def _reversed_clips(batch):
    """Each clip's temporal patches in reverse order (the frames of a clip fed last first)."""
    rows, at = [], 0
    for t, h, w in batch["video_grid_thw"].tolist():
        clip = batch["pixel_values_videos"][at:at + t * h * w]
        rows.append(clip.reshape(t, h * w, -1).flip(0).reshape(t * h * w, -1))
        at += t * h * w
    return {**batch, "pixel_values_videos": torch.cat(rows)}


def _reference_loss(argv, step=0, all_tokens=False, reverse_clips=False):
    """The single-process HF model's own loss on step `step`'s global batch, as the recipe builds model and data."""
    from ds_hetero.data.loader import GlobalBatchLoader
    from tests.helpers.collate import _collate

    recipe = _recipe()
    args = recipe.parse_args(argv)
    torch.manual_seed(args.seed)
    model, _ = recipe.build_model(args)
    dataset = recipe.build_dataset(args, model)
    indices = GlobalBatchLoader(dataset, 16, seed=args.seed).indices(step)
    batch = _collate([dataset[i] for i in indices])
    if all_tokens:
        batch["labels"] = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)
    if "image_grid_thw" in batch or "video_grid_thw" in batch:  # the processor's: 1 image, 2 video placeholders
        batch["mm_token_type_ids"] = (batch["input_ids"] == model.config.image_token_id).int() + \
            2 * (batch["input_ids"] == model.config.video_token_id).int()
    if reverse_clips:
        batch = _reversed_clips(batch)
    with torch.no_grad():
        return float(model(**batch).loss), dataset


@pytest.mark.parametrize("name", ["llava", "qwen2-vl", "qwen2.5-vl videos"])
def test_first_step_loss_equals_one_hf_process(runs, name):
    argv, summary = runs[name]
    assert summary["steps"] == 3 and all(math.isfinite(x) for x in summary["losses"]), summary["losses"]
    want, dataset = _reference_loss(argv)
    got = summary["first_loss"]
    assert abs(got - want) <= REL * abs(want), (got, want)
    if name == "qwen2-vl":
        assert len(dataset) == 48 and [e.row for e in dataset.skipped] == [3, 49]
        # the layout line names the data source with its rows read and skipped (reporting/layout_line.py)
        assert summary["layout"].endswith("with_bad_rows.json, 50 rows read, 2 skipped"), summary["layout"]
    elif name == "qwen2.5-vl videos":
        print(f"{name}: first loss {got} against {want} (relative {abs(got - want) / abs(want):.1e})")
        assert len(dataset) == 24 and [e.row for e in dataset.skipped] == [24]
        assert "broken.mp4 cannot be read" in str(dataset.skipped[0])
        assert summary["layout"].endswith("videos.jsonl, 25 rows read, 1 skipped"), summary["layout"]
        indices = __import__("ds_hetero.data.loader", fromlist=["GlobalBatchLoader"]).GlobalBatchLoader(
            dataset, 16, seed=0).indices(0)
        assert sum("pixel_values_videos" in dataset[i] for i in indices) >= 4  # the first batch holds clips
    else:
        assert summary["layout"].endswith("shapes_messages.jsonl, 48 rows read, 0 skipped"), summary["layout"]
    # negative controls: labels on every token, or the next step's batch, fail the check. At the seeded
    # random init every token's loss is near ln(vocab), so they differ by 1.1e-4..2.9e-3 relative (measured).
    controls = ({"all_tokens": True}, {"step": 1}) + (({"reverse_clips": True},) if "videos" in name else ())
    for kwargs in controls:
        other, _ = _reference_loss(argv, **kwargs)
        assert abs(got - other) > 10 * REL * abs(other), (kwargs, got, other)
