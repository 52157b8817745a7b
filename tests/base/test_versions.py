"""ds_hetero/versions.py: the floor refused clearly, and Qwen2.5-Omni's thinker read in both layouts (pure)."""

from types import SimpleNamespace

import pytest
import torch

from ds_hetero.versions import TRANSFORMERS_FLOOR, check_transformers, omni_parts


def test_a_transformers_below_the_floor_is_refused_at_import():
    check_transformers(TRANSFORMERS_FLOOR)
    check_transformers("5.23.0")
    with pytest.raises(ImportError, match=r"transformers >= 5\.13\.0 \(found 5\.6\.2\)"):
        check_transformers("5.6.2")


def test_omni_parts_reads_both_thinker_layouts():
    visual, audio, text = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    inner = SimpleNamespace(visual=visual, audio_tower=audio, language_model=text)
    new = omni_parts(SimpleNamespace(model=inner))  # transformers >= 5.23: Qwen2_5OmniThinkerModel
    assert new == (visual, audio, text, inner)
    thinker = SimpleNamespace(model=text, visual=visual, audio_tower=audio)  # <= 5.22: on the thinker
    assert omni_parts(thinker) == (visual, audio, text, thinker)
