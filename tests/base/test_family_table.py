"""docs/model-families.md's "Features by family" table cannot go stale quietly (one process, no launch).

- its rows are the registry's families (a new family needs a row) and its columns the features;
- every cell is "exact" with a test, "refused" with a reason, or "untested", and every key it uses is defined;
- every test it names exists: the file, the module-level test function, and the run or parameter it rests on
  as a string in that file (the tests themselves are not run here: most are 4-rank launches);
- the sp, cp, pp and ep columns agree with validate's model checks on the family's tiny model, built on the
  meta device: a refused cell is refused with its reason's words, an exact or untested one is accepted
  (Gemma 4's ep on its MoE variant); the video column's refusals are `check_sample`'s, and its other cells
  are families whose samples take `pixel_values_videos`.

Not checked here, being launches: the placements, packing, LoRA and checkpoint cells beyond their tests'
existence, and R6 (needs an InternViT with use_qk_norm).
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "model-families.md"
COLUMNS = ["tp", "sp", "cp", "pp", "ep", "packing", "video", "colocated", "disaggregated", "mixed", "first_stage",
           "LoRA", "checkpoints"]
LANGUAGE = {"sp": {"tp": 2, "dp": 2, "sequence_parallel": True}, "cp": {"tp": 1, "cp": 2, "dp": 2},
            "pp": {"tp": 1, "dp": 2, "pp": 2}, "ep": {"tp": 1, "dp": 4, "ep": 2}}


def _block(text: str, name: str) -> str:
    match = re.search(rf"<!-- {name} -->\n(.*?)<!-- /{name} -->", text, re.S)
    assert match, f"docs/model-families.md has no <!-- {name} --> block"
    return match.group(1)


@functools.lru_cache(maxsize=None)
def _doc():
    """(header, {family name: {column: cell}}, {Tn: (path, function, case)}, {Rn: reason's words})."""
    text = DOC.read_text()
    lines = [line for line in _block(text, "feature-table").splitlines() if line.startswith("|")]
    split = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    header, rows = split[0], {}
    for cells in split[2:]:
        name = re.search(r"`([^`]+)`", cells[0])
        assert name, cells[0]
        assert len(cells) == len(header), (name.group(1), len(cells), len(header))
        rows[name.group(1)] = dict(zip(header[1:], cells[1:]))
    tests = {}
    for line in _block(text, "feature-tests").splitlines():
        m = re.match(r"- (T\d+): `([^`:]+)::(\w+)(?:\[(.+?)\])?`", line)
        assert m, line
        tests[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    refusals = {}
    for line in _block(text, "feature-refusals").splitlines():
        m = re.match(r"- (R\d+): .*?: \"(.+)\"$", line)
        assert m, line
        refusals[m.group(1)] = m.group(2)
    return header, rows, tests, refusals


def test_rows_are_the_registrys_families_and_columns_the_features():
    from ds_hetero.families import FAMILIES

    header, rows, _, _ = _doc()
    assert header == ["family", *COLUMNS], header
    assert list(rows) == [f.name for f in FAMILIES], list(rows)


def test_every_cell_says_exact_refused_or_untested_with_its_keys():
    _, rows, tests, refusals = _doc()
    used = set()
    for family, cells in rows.items():
        for column, cell in cells.items():
            keys = re.findall(r"\b[TR]\d+\b", cell)
            used.update(keys)
            kind = cell.split()[0]
            assert kind in ("exact", "refused", "untested"), (family, column, cell)
            if kind == "exact":
                assert any(k.startswith("T") for k in keys), (family, column, cell)
            if kind == "refused":
                assert any(k.startswith("R") for k in keys), (family, column, cell)
            if kind == "untested":
                assert not keys, (family, column, cell)
            for k in keys:
                assert k in (tests if k.startswith("T") else refusals), (family, column, k)
    assert used == set(tests) | set(refusals), sorted((set(tests) | set(refusals)) - used)


def _strings(tree) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@pytest.mark.parametrize("key", sorted(_doc()[2], key=lambda k: int(k[1:])))
def test_every_named_test_exists(key):
    path, function, case = _doc()[2][key]
    file = ROOT / "tests" / path
    assert file.is_file(), (key, path)
    tree = ast.parse(file.read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert function in functions and function.startswith("test_"), (key, path, function)
    if case is not None:
        assert case in _strings(tree), (key, path, case)


def test_a_per_family_test_has_the_familys_case():
    """Where a row cites a test run once per family (parametrized by family), the family is one of its cases."""
    _, rows, tests, _ = _doc()
    for family, cells in rows.items():
        for column, cell in cells.items():
            for key in re.findall(r"\bT\d+\b", cell):
                path, function, case = tests[key]
                source = (ROOT / "tests" / path).read_text()
                if case is None and re.search(r"parametrize\(\s*\"family\"", source):
                    assert f'"{family.replace("-", "_").replace(".", "_")}"' in source, (family, column, key)


@functools.lru_cache(maxsize=None)
def _meta(name: str, moe: bool = False):
    import torch

    from ds_hetero.families import adapter_for
    from ds_hetero.families.meta import meta_model

    if moe:
        from ds_hetero.families.gemma4.tiny import tiny_gemma4

        with torch.device("meta"):
            model = tiny_gemma4(moe=True)
    else:
        model = meta_model(f"tiny-{name}")
    return model, adapter_for(model)


def _validate(family, column):
    """None, or the HeteroConfigError validate's model checks raise for `column` on the family's tiny model."""
    from ds_hetero.config import load_config
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.families import family_named
    from ds_hetero.validation import check_model

    stages = {name: {"dp": 4} for name in family_named(family).encoder_stages}
    stages["language"] = LANGUAGE[column]
    ds = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "hetero_parallel": {"micro_batches": 4 if column == "pp" else 2, "stages": stages}}
    model, adapter = _meta(family, moe=family == "gemma4" and column == "ep")
    try:
        check_model(load_config(ds, 4), model, adapter)
    except HeteroConfigError as exc:
        return exc
    return None


@pytest.mark.parametrize("column", list(LANGUAGE))
def test_sequence_pipeline_and_expert_cells_agree_with_validate(column):
    _, rows, _, refusals = _doc()
    for family, cells in rows.items():
        cell, error = cells[column], _validate(family, column)
        if cell.startswith("refused"):
            words = [refusals[k] for k in re.findall(r"\bR\d+\b", cell)]
            assert error is not None, f"{family} {column}: the table says refused, validate accepts it"
            assert any(w in str(error) for w in words), (family, column, words, str(error))
        else:
            assert error is None, f"{family} {column}: the table says {cell!r}, validate refuses: {error}"


def test_video_cells_agree_with_the_sample_checks():
    import torch

    _, rows, _, refusals = _doc()
    for family, cells in rows.items():
        _, adapter = _meta(family)
        cell = cells["video"]
        if cell.startswith("refused"):
            words = [refusals[k] for k in re.findall(r"\bR\d+\b", cell)]
            sample = {"input_ids": torch.tensor([3, 4, 5]), "labels": torch.tensor([3, 4, 5]),
                      "pixel_values_videos": torch.zeros(4, 8), "video_grid_thw": torch.tensor([[1, 2, 2]])}
            with pytest.raises(ValueError) as exc:
                adapter.check_sample(sample, 0)
            assert any(w in str(exc.value) for w in words), (family, words, str(exc.value))
        else:
            assert "pixel_values_videos" in adapter.SAMPLE_FIELDS, (family, cell)
