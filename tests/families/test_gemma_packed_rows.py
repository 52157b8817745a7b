"""Packed Gemma 3 and Gemma 4 rows on one process: each sample of a packed row attends only within
itself under its own masks (models/sample_masks.py + models/per_sample_attention.py), so the packed
language stage equals each sample run alone: logits, loss, and every gradient (parameters and the
boundary rows) of <logits, w>, under sdpa and eager.

The samples are longer than the tiny models' window (4), hold images (Gemma 3: 4 tokens each, several
per sample; Gemma 4: 2-4) and text-only samples, and the rows end with a padding segment, so the
sliding windows, the image blocks and the boundaries all act. Negative controls, each with its measured
distance: the whole row under one causal mask (no per-sample boundary: attention and sliding windows
cross samples), and each sample causal and windowed but without its bidirectional image blocks.
Also: `validate` and `initialize` agree (packed valid; `"row_mask"` refused by both, naming the field).
"""

import pytest
import torch

from ds_hetero.families import adapter_for
from ds_hetero.loss import token_loss_sum
from ds_hetero.models.packing import packed_language_inputs
from ds_hetero.models.per_sample_attention import apply_per_sample_attention, calls_per_sample
from ds_hetero.toy import tiny_gemma3, tiny_gemma4
from tests.helpers.family_data import gemma3_samples
from tests.helpers.gemma4_data import SPECS, gemma4_samples


def _gemma3():
    model = tiny_gemma3(seed=1)
    return model, gemma3_samples(model, [1, 0, 2, 3, 0, 1], text_len=7, seed=3)


def _gemma4():
    model = tiny_gemma4(seed=1)
    return model, gemma4_samples(model, SPECS[:6], text_len=6, seed=3)


FAMILIES = {"gemma3": _gemma3, "gemma4": _gemma4}


def _rows(adapter, samples, seed=0):
    """Random boundary rows per encoder for these samples, in sample order."""
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(port.count(s), adapter.hidden_size, generator=gen) for s in samples]
            for port in adapter.encoders().values()]


def _run(language, ids, rows, mask, positions, weights, **packed):
    """Logits and the gradients of <logits, weights> (every parameter's, each encoder's rows')."""
    language.zero_grad()
    rows = tuple(torch.cat(r).clone().requires_grad_(True) for r in rows)
    logits = language(ids, rows, mask, positions, **packed)
    (logits * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in language.named_parameters() if p.grad is not None}
    return logits.detach(), grads, [r.grad for r in rows]


def _case(family, kernel):
    model, samples = FAMILIES[family]()
    model.config.text_config._attn_implementation_internal = kernel  # the decoder's (Gemma 4's audio tower: eager only)
    adapter = adapter_for(model)
    language = adapter.split()["language"]
    assert apply_per_sample_attention(language.language_model) == sum(map(calls_per_sample, language.modules())) > 0
    packing = [samples[:3], samples[3:]]  # two rows, the second padded (a padding segment)
    batch = packed_language_inputs(adapter, packing, multiple=8)
    assert batch["packed_segments"][1][-1] or batch["packed_segments"][0][-1]
    rows = _rows(adapter, samples)
    torch.manual_seed(0)
    weights = torch.randn(*batch["input_ids"].shape, language.lm_head.out_features)
    return model, adapter, language, samples, packing, batch, rows, weights


def _alone(adapter, language, samples, rows, weights, packing):
    """Each sample run alone (its own padded batch of one, the decoder's own masks): logits, loss sum,
    and the parameter gradients summed over the samples (the packed row's weights sliced per sample)."""
    logits, loss, grads, row_grads = [], 0.0, {}, [[] for _ in rows]
    i = 0
    for r, row in enumerate(packing):
        offset = 0
        for s in row:
            n = int(s["input_ids"].numel())
            b = adapter.language_inputs([s])
            out, g, rg = _run(language, b["input_ids"], [[e[i]] for e in rows], b["attention_mask"],
                              b["position_ids"], weights[r:r + 1, offset:offset + n])
            with torch.no_grad():
                loss += float(token_loss_sum(language(b["input_ids"], tuple(e[i] for e in rows), b["attention_mask"],
                                                      b["position_ids"]), b["labels"]))
            logits.append(out[0])
            for k, v in g.items():
                grads[k] = grads.get(k, 0) + v
            for e, gr in enumerate(rg):
                row_grads[e].append(gr)
            offset += n
            i += 1
    return logits, loss, grads, [torch.cat(g) for g in row_grads]


def _unpack(logits, packing):
    out = []
    for r, row in enumerate(packing):
        offset = 0
        for s in row:
            n = int(s["input_ids"].numel())
            out.append(logits[r, offset:offset + n])
            offset += n
    return out


def _distance(got, want):
    """The largest difference over the largest entry, over a list of tensor pairs."""
    return max(float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30) for a, b in zip(got, want, strict=True))


def _packed(language, batch, rows, weights):
    return _run(language, batch["input_ids"], rows, None, batch["position_ids"], weights,
                packed_segments=batch["packed_segments"])


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_rows_attend_each_sample_under_its_own_masks(family, kernel):
    model, adapter, language, samples, packing, batch, rows, weights = _case(family, kernel)
    window = model.config.text_config.sliding_window
    assert all(int(s["input_ids"].numel()) > window for s in samples)  # the window acts inside every sample
    logits, loss, grads, row_grads = _alone(adapter, language, samples, rows, weights, packing)
    keywords = language.packed_keywords(batch["input_ids"], torch.zeros(*batch["input_ids"].shape, 1), None,
                                        batch["packed_segments"])
    assert set(keywords["packed_masks"]) == {"full_attention", "sliding_attention"}  # the family's own, per sample
    got = _packed(language, batch, rows, weights)
    assert _distance(_unpack(got[0], packing), logits) <= 1e-5
    packed_loss = float(token_loss_sum(got[0], batch["labels"]))
    assert abs(packed_loss - loss) <= 1e-5 * abs(loss), (packed_loss, loss)
    assert got[1].keys() == grads.keys()
    assert _distance(list(got[1].values()), list(grads.values())) <= 1e-5
    assert _distance(got[2], row_grads) <= 1e-5


# Negative controls (sdpa; the distances printed are what docs/packing.md quotes)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_negative_controls_miss_the_bar(family, capsys):
    model, adapter, language, samples, packing, batch, rows, weights = _case(family, "sdpa")
    logits, _, grads, _ = _alone(adapter, language, samples, rows, weights, packing)
    own = language.packed_keywords
    controls = {
        # the row one segment: attention and the sliding windows cross its samples
        "whole-row causal mask": lambda ids, hidden, mask, segments: {
            "packed_segments": tuple((sum(row),) for row in segments)},
        # each sample causal inside its windows, the family's own masks (its image blocks) withheld
        "no bidirectional image blocks": lambda ids, hidden, mask, segments: {
            **own(ids, hidden, mask, segments), "packed_masks": None},
    }
    far = {}
    for name, keywords in controls.items():
        language.packed_keywords = keywords  # the instance's, for this control only
        try:
            got = _packed(language, batch, rows, weights)
        finally:
            del language.packed_keywords
        far[name] = (_distance(_unpack(got[0], packing), logits), _distance(list(got[1].values()), list(grads.values())))
        assert far[name][0] > 1e-3 and far[name][1] > 1e-3, (family, name, far[name])
    with capsys.disabled():
        print(f"\n{family} negative controls (logits, gradients; relative to the largest entry): {far}")


# ------------------------------------------------------------------ validate agrees with initialize
BASE = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
STAGES = {"gemma3": {"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}},
          "gemma4": {"vision": {"dp": 4}, "audio": {"dp": 4}, "language": {"tp": 2, "dp": 2}}}
BUILD = {"gemma3": tiny_gemma3, "gemma4": tiny_gemma4}


def _section(family, **more):
    return {"micro_batches": 2, "language_batching": "packed", "stages": STAGES[family], **more}


def _validate(tmp_path, family, section, capsys):
    import json

    from ds_hetero.cli import main

    path = tmp_path / "c.json"
    path.write_text(json.dumps({**BASE, "hetero_parallel": section}))
    code = main(["validate", str(path), "--world-size", "4", "--model", f"tiny-{family}"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_validate_accepts_packed_gemma(family, tmp_path, capsys):
    code, err = _validate(tmp_path, family, _section(family), capsys)
    assert code == 0, err


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_validate_and_initialize_refuse_a_whole_row_mask_alike(family, tmp_path, capsys, monkeypatch):
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.errors import HeteroConfigError

    field, section = "hetero_parallel.packed_attention", _section(family, packed_attention="row_mask")
    code, err = _validate(tmp_path, family, section, capsys)
    assert code == 1 and f"'{field}'" in err and "per-sample attention only" in err, err
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(HeteroConfigError) as info:
        ds_hetero.initialize(BUILD[family](), {**BASE, "hetero_parallel": section})
    assert info.value.field == field, str(info.value)
    assert not dist.is_initialized()  # refused before any process group
