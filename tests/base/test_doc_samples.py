"""The command outputs quoted in docs/ are the commands' own output today (docs/samples.py regenerates them)."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _samples():
    spec = importlib.util.spec_from_file_location("doc_samples", os.path.join(ROOT, "docs", "samples.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_sample_in_docs_is_stale():
    samples = _samples()
    paths = [os.path.join(ROOT, "docs", name) for name in sorted(os.listdir(os.path.join(ROOT, "docs")))
             if name.endswith(".md")]
    assert samples.stale(paths) == [], "run: .venv/bin/python docs/samples.py"


def test_configuration_page_quotes_validate():
    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        text = f.read()
    assert "<!-- sample: ds-hetero validate ds_configs/llava_colocated.json --world-size 4 -->" in text
    assert "<!-- sample: ds-hetero validate ds_configs/llava_packed.json --world-size 4 -->" in text


def test_negative_control_an_edited_sample_is_stale(tmp_path):
    samples = _samples()
    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        text = f.read()
    page = tmp_path / "page.md"
    page.write_text(text.replace("valid for 4 ranks", "valid for 5 ranks", 1))
    assert samples.stale([str(page)]) == [os.path.relpath(str(page), ROOT)]
    page.write_text(samples.regenerated(page.read_text()))
    assert samples.stale([str(page)]) == []
