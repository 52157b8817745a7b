"""Packed rows (models/packing.py) on one process, every model family: the packed forward of the
language stage equals each sample's own forward, and the packed loss the per-sample losses.

The mask is transformers' own (packed `position_ids`, no attention mask); under sequence shards
the stage passes `packed_attention_mask`, which must equal what transformers builds. Negative
controls: positions that run on across samples, and a sample's first label kept, both differ.
"""

import pytest
import torch

from ds_hetero.context_parallel.sequence import packed_attention_mask
from ds_hetero.loss import IGNORE_INDEX, token_loss_sum
from ds_hetero.families import adapter_for
from ds_hetero.models.packing import packed_language_inputs
from ds_hetero.toy import tiny_llava, tiny_qwen2_5_omni, tiny_qwen2_vl, tiny_qwen3_5
from ds_hetero.toy import (tiny_gemma3, tiny_internvl, tiny_llava_onevision, tiny_qwen2_5_vl,
                                            tiny_qwen3_vl)
from ds_hetero.testing.omni_samples import omni_samples
from ds_hetero.testing.uneven import llava_uneven, qwen_uneven
from tests.helpers.family_data import gemma3_samples, internvl_samples

QWEN = [[(1, 4, 4)], None, [(1, 4, 8), (1, 4, 4)], None, [(1, 8, 4)]]


def _placeholder_samples(model, runs, seed=0):
    """Text, `k` image placeholders, text (the language stage sees only the ids)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, k in enumerate(runs):
        text = torch.randint(2, 200, (4 + i,), generator=gen)
        ids = torch.cat([text[:2], torch.full((k,), model.config.image_token_id), text[2:]])
        labels = torch.cat([text[:2], torch.full((k,), IGNORE_INDEX), text[2:]])
        out.append({"input_ids": ids, "labels": labels})
    return out


FAMILIES = {
    "llava": lambda: (m := tiny_llava("clip", seed=1), llava_uneven(m, [1, 0, 2, 0, 1], seed=3)),
    "qwen2_vl": lambda: (m := tiny_qwen2_vl(seed=1), qwen_uneven(m, QWEN, seed=3)),
    "qwen2_5_vl": lambda: (m := tiny_qwen2_5_vl(seed=1), qwen_uneven(m, QWEN, seed=3)),
    "qwen3_vl": lambda: (m := tiny_qwen3_vl(seed=1), qwen_uneven(m, QWEN, seed=3)),
    "omni": lambda: (m := tiny_qwen2_5_omni(seed=1), omni_samples(
        m, [[("image", (1, 4, 4))], [("audio", 20)], [], [("audio", 13), ("image", (1, 4, 8))], []], seed=3)),
    "qwen3_5": lambda: (m := tiny_qwen3_5(seed=1), qwen_uneven(m, QWEN, seed=3)),
    "gemma3": lambda: (m := tiny_gemma3(seed=1), gemma3_samples(m, [1, 0, 2, 0, 1], seed=3)),
    "internvl": lambda: (m := tiny_internvl(seed=1), internvl_samples(m, [[1], [], [1, 1], [], [2]], seed=3)),
    "llava_onevision": lambda: (m := tiny_llava_onevision(seed=1), _placeholder_samples(m, [6, 0, 3, 0, 9])),
}


def _rows(adapter, samples, seed=0):
    """Random boundary rows per encoder for these samples, in sample order."""
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(port.count(s), adapter.hidden_size, generator=gen) for s in samples]
            for port in adapter.encoders().values()]


def _forward(language, batch, rows, mask=None):
    return language(batch["input_ids"], tuple(torch.cat(r) for r in rows), mask, batch["position_ids"])


def _per_sample(adapter, language, samples, rows):
    logits, total = [], 0.0
    for i, s in enumerate(samples):
        b = adapter.language_inputs([s])
        out = _forward(language, b, [[r[i]] for r in rows], b["attention_mask"])
        logits.append(out[0])
        total += float(token_loss_sum(out, b["labels"]))
    return logits, total


def _unpack(logits, rows_of_samples):
    out = []
    for r, row in enumerate(rows_of_samples):
        offset = 0
        for s in row:
            n = int(s["input_ids"].numel())
            out.append(logits[r, offset:offset + n])
            offset += n
    return out


# packed only with the rows' segments passed to the decoder: Qwen3.5 (its Gated DeltaNet restarts at each:
# tests/families/test_qwen3_5_packed_rows.py) and Gemma 3 (each sample's own image-block and window masks:
# tests/families/test_gemma_packed_rows.py)
SEGMENTED = {"qwen3_5", "gemma3"}


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - SEGMENTED))
@torch.no_grad()
def test_packed_rows_equal_each_sample_alone(family):
    model, samples = FAMILIES[family]()
    model = model.float().eval()
    adapter = adapter_for(model)
    language = adapter.split()["language"]
    rows = _rows(adapter, samples)
    want, want_loss = _per_sample(adapter, language, samples, rows)
    packing = [samples[:3], samples[3:]]  # two rows of different length: the second is padded
    batch = packed_language_inputs(adapter, packing, multiple=4)
    assert batch["attention_mask"] is None and batch["input_ids"].shape[-1] % 4 == 0
    got = _forward(language, batch, rows)
    for a, b in zip(_unpack(got, packing), want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert abs(float(token_loss_sum(got, batch["labels"])) - want_loss) <= 1e-5 * abs(want_loss)
    # the same rows with the full mask the sequence-sharded path passes
    sharded = _forward(language, batch, rows, packed_attention_mask(batch["sequence_ids"]))
    torch.testing.assert_close(sharded, got, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_mrope_positions_are_each_samples_own():
    model = tiny_qwen2_vl(seed=1)
    adapter = adapter_for(model)
    samples = qwen_uneven(model, QWEN, seed=3)
    batch = packed_language_inputs(adapter, [samples])
    assert batch["position_ids"].shape == (4, 1, sum(int(s["input_ids"].numel()) for s in samples))
    offset = 0
    for s in samples:
        n = int(s["input_ids"].numel())
        own = adapter.language_inputs([s])["position_ids"][:, 0]
        assert torch.equal(batch["position_ids"][1:, 0, offset:offset + n], own)
        assert torch.equal(batch["position_ids"][0, 0, offset:offset + n], torch.arange(n))
        offset += n


@torch.no_grad()
def test_negative_controls_differ():
    model = tiny_llava("clip", seed=1).float().eval()
    adapter = adapter_for(model)
    language = adapter.split()["language"]
    samples = llava_uneven(model, [1, 0, 2, 0, 1], seed=3)
    rows = _rows(adapter, samples)
    want, want_loss = _per_sample(adapter, language, samples, rows)
    batch = packed_language_inputs(adapter, [samples])
    running = dict(batch, position_ids=torch.arange(batch["input_ids"].shape[-1])[None])
    got = _unpack(_forward(language, running, rows), [samples])
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) > 1e-2  # attention crossed samples
    kept = batch["labels"].clone()
    offset = 0
    for s in samples:
        kept[0, offset] = s["labels"][0]
        offset += int(s["input_ids"].numel())
    loss = float(token_loss_sum(_forward(language, batch, rows), kept))
    assert any(int(s["labels"][0]) != IGNORE_INDEX for s in samples[1:])  # a text-only sample's first label
    assert abs(loss - want_loss) > 1e-3 * abs(want_loss)


def test_packed_mask_is_what_transformers_builds():
    from transformers.masking_utils import create_causal_mask

    model = tiny_llava("clip", seed=1)
    adapter = adapter_for(model)
    samples = llava_uneven(model, [1, 0, 2], seed=3)
    batch = packed_language_inputs(adapter, [samples[:2], samples[2:]], multiple=8)
    embeds = torch.zeros(*batch["input_ids"].shape, 8)
    theirs = create_causal_mask(config=model.config.text_config, inputs_embeds=embeds, attention_mask=None,
                                past_key_values=None, position_ids=batch["position_ids"])
    assert torch.equal(theirs, packed_attention_mask(batch["sequence_ids"]))
