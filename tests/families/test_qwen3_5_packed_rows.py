"""Qwen3.5 packed rows on one process (families/qwen3_5/packed_deltanet.py): each Gated DeltaNet layer
restarts its convolution and recurrence at every sample of a packed row.

- The segmented layer (fp64) on two packed rows (samples across the 64-position chunks of the delta
  rule, an empty sample, a padding segment) equals each sample run alone through the stock layer:
  its output (1e-12), and its adjoint: for a random cotangent y, the input gradient of <f(x), y> and
  every parameter's gradient equal the samples' own summed (1e-6: the layer takes its decay's gradient
  through float32 even in a float64 model). Negative control: the stock layer on
  the packed rows (state carried from sample to sample) differs.
- The language stage of Qwen3.5 and Qwen3.5-MoE (fp32), packed as the engine packs (per-sample
  attention, the segmented Gated DeltaNet): every sample's logits and the loss equal the sample's
  own unpacked forward (1e-5); with the stock Gated DeltaNet layers they do not.
- The varlen-kernel path's boundaries (`cu_seqlens`, `seq_idx`), and that without the kernels it
  refuses (transformers' torch fallbacks raise on them) rather than leak state silently; through
  stand-in kernels that honour those boundaries (the model file's torch functions per sample) it
  equals each sample alone: the keywords reach the kernels, on one flattened sequence.
- `ds-hetero validate` and `initialize` agree: packed Qwen3.5 is valid (and packed with cp 2:
  tests/families/test_qwen3_5_sequence_shards.py); packed with "row_mask" is refused by both, naming the
  same field.
"""

import json

import pytest
import torch

from ds_hetero.families import adapter_for
from ds_hetero.families.qwen3_5.packed_deltanet import (apply_segmented_deltanet, restarts_per_sample,
                                                        segmented_forward, varlen_arguments)
from ds_hetero.loss import token_loss_sum
from ds_hetero.models.packing import packed_language_inputs
from ds_hetero.models.per_sample_attention import apply_per_sample_attention
from ds_hetero.testing.uneven import qwen_uneven
from ds_hetero.toy import tiny_qwen3_5, tiny_qwen3_5_moe

# two rows: samples longer than the delta rule's 64-position chunk, an empty one, a padding segment
SEGMENTS = ((5, 70, 3), (9, 0, 60, 9))
LENGTH = 78
GRIDS = [[(1, 4, 4)], None, [(1, 4, 8), (1, 4, 4)], None, [(1, 8, 4)]]


def _layer(family="qwen3_5"):
    model = (tiny_qwen3_5 if family == "qwen3_5" else tiny_qwen3_5_moe)(seed=3).double()
    return model.model.language_model.layers[0].linear_attn


def _grads(layer, x, y, run):
    layer.zero_grad()
    x = x.clone().requires_grad_(True)
    out = run(x)
    (out * y).sum().backward()
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}


def _alone(layer, x):
    """Each sample of the packed rows through the stock layer on its own, laid back in the rows."""
    rows = []
    for r, row in enumerate(SEGMENTS):
        start, parts = 0, []
        for n in row:
            if n:
                parts.append(layer(x[r:r + 1, start:start + n]))
            start += n
        rows.append(torch.cat(parts, dim=1))
    return torch.cat(rows)


def _rel(a, b):
    return float((a - b).detach().abs().max() / b.detach().abs().max())


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_segmented_layer_and_its_adjoint_equal_each_sample_alone(family):
    layer = _layer(family)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, LENGTH, layer.hidden_size, generator=gen, dtype=torch.float64)
    y = torch.randn(2, LENGTH, layer.hidden_size, generator=gen, dtype=torch.float64)
    want = _grads(layer, x, y, lambda t: _alone(layer, t))
    got = _grads(layer, x, y, lambda t: segmented_forward(layer, t, packed_segments=SEGMENTS))
    assert _rel(got[0], want[0]) < 1e-12
    # the layer computes its decay's input in float32 (`a.float()`), so its gradient passes a float32
    # rounding even in a float64 model: the gradients agree to float32's rounding, not float64's
    assert _rel(got[1], want[1]) < 1e-6, _rel(got[1], want[1])
    assert max(_rel(got[2][n], want[2][n]) for n in want[2]) < 1e-6, {n: _rel(got[2][n], want[2][n]) for n in want[2]}
    # <f(x), y> = <x, f^T y> per sample is what the gradient above checks; the stock layer on the rows differs
    stock = _grads(layer, x, y, lambda t: layer(t))
    assert _rel(stock[0], want[0]) > 1e-2 and _rel(stock[1], want[1]) > 1e-2


def test_without_segments_the_layer_is_the_stock_layer():
    layer = _layer()
    x = torch.randn(2, 11, layer.hidden_size, dtype=torch.float64)
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, -3:] = 0
    want = layer(x, attention_mask=mask)
    assert apply_segmented_deltanet(layer) == 1 and apply_segmented_deltanet(layer) == 1  # idempotent
    assert restarts_per_sample(layer)
    assert torch.equal(layer(x, attention_mask=mask), want)
    # a row that is one sample: the row itself (another batch shape: float64 rounding, not bitwise)
    assert _rel(layer(x[:1], packed_segments=((11,),)), want[:1]) < 1e-12


def test_varlen_boundaries_and_no_silent_fallback():
    cu_seqlens, seq_idx = varlen_arguments(SEGMENTS, torch.device("cpu"))
    assert cu_seqlens.tolist() == [0, 5, 75, 78, 87, 147, 156] and cu_seqlens.dtype == torch.int32
    assert seq_idx.shape == (1, 2 * LENGTH) and seq_idx.dtype == torch.int32
    assert seq_idx[0].bincount().tolist() == [5, 70, 3, 9, 60, 9]
    layer = _layer()
    x = torch.randn(2, LENGTH, layer.hidden_size, dtype=torch.float64)
    # without flash-linear-attention / causal-conv1d, transformers' torch fallbacks refuse the boundaries
    with pytest.raises(ValueError, match="packed sequences"):
        segmented_forward(layer, x, packed_segments=SEGMENTS, use_varlen=True)


def _boundary_kernels(monkeypatch, seen):
    """Stand-ins for causal-conv1d and flash-linear-attention with their boundary semantics (`seq_idx`:
    each position's sample; `cu_seqlens`: the samples' starts), made of the model file's own torch
    functions run per sample: what the varlen path hands the kernels, checked on a CPU."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    conv, rule = hf.causal_conv1d_fn, hf.torch_chunk_gated_delta_rule

    def conv_with_seq_idx(x, weight, bias=None, activation=None, seq_idx=None, **_):
        seen["seq_idx"] = seq_idx
        ids = seq_idx[0].tolist()
        cuts = [i for i in range(1, len(ids)) if ids[i] != ids[i - 1]] + [len(ids)]
        parts, start = [], 0
        for end in cuts:
            parts.append(conv(x[..., start:end], weight, bias, activation=activation))
            start = end
        return torch.cat(parts, dim=-1)

    def rule_with_cu_seqlens(query, key, value, g, beta, cu_seqlens=None, **kw):
        seen["cu_seqlens"] = cu_seqlens
        assert query.shape[0] == 1  # the kernels take boundaries on one flattened sequence
        kw = {k: v for k, v in kw.items() if k in ("initial_state", "output_final_state", "use_qk_l2norm_in_kernel")}
        bounds = cu_seqlens.tolist()
        outs = [rule(*(t[:, a:b] for t in (query, key, value, g, beta)), **kw)[0] for a, b in zip(bounds, bounds[1:])]
        return torch.cat(outs, dim=1), None

    monkeypatch.setattr(hf, "causal_conv1d_fn", conv_with_seq_idx)
    monkeypatch.setattr(hf, "torch_chunk_gated_delta_rule", rule_with_cu_seqlens)


def test_varlen_path_hands_the_kernels_each_samples_bounds(monkeypatch):
    """The varlen path (rows flattened, `cu_seq_lens_q` and `seq_idx` to the layer) through stand-in
    kernels that honour the bounds equals each sample alone: the keywords reach the kernels, as one
    sequence, in the layouts they take."""
    layer = _layer()
    x = torch.randn(2, LENGTH, layer.hidden_size, dtype=torch.float64)
    want = _alone(layer, x)
    seen = {}
    _boundary_kernels(monkeypatch, seen)
    got = segmented_forward(layer, x, packed_segments=SEGMENTS, use_varlen=True)
    assert _rel(got, want) < 1e-12
    assert seen["cu_seqlens"].tolist() == [0, 5, 75, 78, 87, 147, 156] and seen["seq_idx"].shape == (1, 2 * LENGTH)


def _stage(family, segmented=True):
    model = (tiny_qwen3_5 if family == "qwen3_5" else tiny_qwen3_5_moe)(seed=1).float().eval()
    adapter = adapter_for(model)
    decoder = model.get_decoder()
    apply_per_sample_attention(decoder)  # what shard() gives a packed language stage (sdpa per sample)
    if segmented:
        adapter.separate_packed_samples(decoder)
    return model, adapter, adapter.split()["language"]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
@torch.no_grad()
def test_packed_language_stage_equals_each_sample_alone(family):
    model, adapter, language = _stage(family)
    samples = qwen_uneven(model, GRIDS, text_len=20, seed=3)
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randn(adapter.encoders()["vision"].count(s), adapter.hidden_size, generator=gen) for s in samples]
    want, want_loss = [], 0.0
    for s, r in zip(samples, rows):
        b = adapter.language_inputs([s])
        out = language(b["input_ids"], r, b["attention_mask"], b["position_ids"])
        want.append(out[0])
        want_loss += float(token_loss_sum(out, b["labels"]))
    packing = [samples[:3], samples[3:]]  # two rows, the second padded
    batch = packed_language_inputs(adapter, packing, multiple=8)

    def packed(stage):
        logits = stage(batch["input_ids"], torch.cat(rows), None, batch["position_ids"],
                       packed_segments=batch["packed_segments"])
        out, i = [], 0
        for r, row in enumerate(packing):
            offset = 0
            for s in row:
                n = int(s["input_ids"].numel())
                out.append(logits[r, offset:offset + n])
                offset += n
        return out, float(token_loss_sum(logits, batch["labels"]))

    got, loss = packed(language)
    assert sum(batch["packed_segments"][0]) > 64  # a row longer than one delta-rule chunk
    for a, b in zip(got, want, strict=True):
        assert _rel(a, b) < 1e-5, _rel(a, b)
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss)
    # negative control: the stock Gated DeltaNet layers carry their state from sample to sample
    _, _, stock = _stage(family, segmented=False)
    stock.load_state_dict(language.state_dict())
    leaked, leaked_loss = packed(stock)
    assert max(_rel(a, b) for a, b in zip(leaked, want)) > 1e-2
    assert abs(leaked_loss - want_loss) > 1e-5 * abs(want_loss)  # the loss fails the bar too (1.5e-4 measured)


# ------------------------------------------------------------------ validate agrees with initialize
BASE = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
PACKED = {"micro_batches": 2, "language_batching": "packed",
          "stages": {"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}}
REFUSED = {
    "row_mask": ({**PACKED, "packed_attention": "row_mask"}, "hetero_parallel.packed_attention"),
}
PACKED_CP2 = {**PACKED, "stages": {"vision": {"dp": 4}, "language": {"cp": 2, "dp": 2}}}


def _validate(tmp_path, section, capsys):
    from ds_hetero.cli import main

    path = tmp_path / "c.json"
    path.write_text(json.dumps({**BASE, "hetero_parallel": section}))
    code = main(["validate", str(path), "--world-size", "4", "--model", "tiny-qwen3.5"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("section", [PACKED, PACKED_CP2], ids=["tp2 dp2", "cp2 dp2"])
def test_validate_accepts_packed_qwen3_5(section, tmp_path, capsys):
    code, err = _validate(tmp_path, section, capsys)
    assert code == 0, err


@pytest.mark.parametrize("name", list(REFUSED))
def test_validate_and_initialize_refuse_alike(name, tmp_path, capsys, monkeypatch):
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.errors import HeteroConfigError

    section, field = REFUSED[name]
    code, err = _validate(tmp_path, section, capsys)
    assert code == 1 and f"'{field}'" in err, (name, err)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(HeteroConfigError) as info:
        ds_hetero.initialize(tiny_qwen3_5(), {**BASE, "hetero_parallel": section})
    assert info.value.field == field, (name, str(info.value))
    assert not dist.is_initialized()  # refused before any process group
