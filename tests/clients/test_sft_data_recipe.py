"""The main job's recipe on the shipped real data (recipes/data), 4 ranks, against one HF process.

One 4-rank launch (run_cases) runs recipes/train_llava.py twice, 3 steps each, on the default layout
(vision dp4, language tp2 dp2, 2 micro-batches):
    llava      --data shapes_messages.jsonl
    qwen2-vl   --data (shapes_llava.json + two bad rows) --image-folder recipes/data --skip-bad-rows
The first step's loss must equal, within 1e-5 relative, the unmodified single-process HF model's own
loss (`model(**batch).loss`) on the same first global batch (the loader's seeded order), padded by
a plain collator (measured: 6e-9 and 5e-8 relative). Negative controls: the same reference with labels on
every token, or on the second step's batch, is off by more than 10x the tolerance.
"""

import importlib.util
import json
import math
import os

import pytest
import torch

from ds_hetero.testing.cases import launch_cases

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "recipes", "data")
CONFIG = os.path.join(ROOT, "ds_configs", "llava_colocated.json")
REL = 1e-5


def _recipe():
    spec = importlib.util.spec_from_file_location("train_llava", os.path.join(ROOT, "recipes", "train_llava.py"))
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe


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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft_recipe")
    argv = {
        "llava": ["--data", os.path.join(DATA, "shapes_messages.jsonl")],
        "qwen2-vl": ["--model-family", "qwen2-vl", "--data", _with_bad_rows(tmp), "--image-folder", DATA,
                     "--skip-bad-rows"],
    }
    cases = {name: (_run_recipe, {"argv": a, "out": str(tmp / name)}) for name, a in argv.items()}
    results = launch_cases(cases, world_size=4, timeout=900)
    return {name: (argv[name], results[name][0]) for name in argv}


def _reference_loss(argv, step=0, all_tokens=False):
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
    if "image_grid_thw" in batch:
        batch["mm_token_type_ids"] = (batch["input_ids"] == model.config.image_token_id).int()
    with torch.no_grad():
        return float(model(**batch).loss), dataset


@pytest.mark.parametrize("name", ["llava", "qwen2-vl"])
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
    else:
        assert summary["layout"].endswith("shapes_messages.jsonl, 48 rows read, 0 skipped"), summary["layout"]
    # negative controls: labels on every token, or the next step's batch, fail the check. At the seeded
    # random init every token's loss is near ln(vocab), so they differ by 1.1e-4..2.9e-3 relative (measured).
    for kwargs in ({"all_tokens": True}, {"step": 1}):
        other, _ = _reference_loss(argv, **kwargs)
        assert abs(got - other) > 10 * REL * abs(other), (kwargs, got, other)
