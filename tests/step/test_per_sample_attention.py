"""The per-sample attention of packed rows (models/per_sample_attention.py), one process, every family
that packs: the language stage's logits and gradients (every parameter's, and the boundary rows')
with sdpa (and eager) called once per sample equal those of the same packed rows under the
block-diagonal mask transformers builds; a call without `packed_segments` is exactly the model's
own kernel; the decoder's config is untouched. Negative control: segments that join the samples
of a row differ. The mode each decoder gets, and the errors of a choice it cannot take. On a
machine with CUDA (recipes/check_gpu.sh) the comparison runs on the GPU too, with TF32 off.
"""

import pytest
import torch

from ds_hetero.errors import HeteroConfigError
from ds_hetero.families import adapter_for
from ds_hetero.models.packing import packed_language_inputs
from ds_hetero.models.per_sample_attention import (KERNELS, apply_per_sample_attention, calls_per_sample,
                                                   packed_attention_mode)
from tests.step.test_packing_rows import FAMILIES, _rows

# qwen3_5: its Gated DeltaNet layers need the segments too, and gemma3 each sample's own image blocks, so the
# block-diagonal mask alone is no reference for them (tests/families/test_qwen3_5_packed_rows.py,
# tests/families/test_gemma_packed_rows.py: against each sample alone)
PACKING = [name for name in FAMILIES if name not in ("qwen3_5", "gemma3")]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _run(language, batch, rows, segments, weights):
    """Logits of the packed batch and every gradient of <logits, weights>."""
    language.zero_grad()
    rows = tuple(r.clone().requires_grad_(True) for r in rows)
    extra = {} if segments is None else {"packed_segments": segments}
    logits = language(batch["input_ids"], rows, None, batch["position_ids"], **extra)
    (logits * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in language.named_parameters() if p.grad is not None}
    return logits.detach(), grads, [r.grad for r in rows]


def _case(name, kernel="sdpa", device="cpu"):
    model, samples = FAMILIES[name]()
    if kernel != "sdpa":
        model.set_attn_implementation(kernel)
    adapter = adapter_for(model)
    language = adapter.split()["language"].to(device)
    # two rows, the second with a padding segment (rows padded to a multiple of 8)
    batch = packed_language_inputs(adapter, [samples[:3], samples[3:]], multiple=8)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    rows = tuple(torch.cat(r).to(device) for r in _rows(adapter, samples))
    torch.manual_seed(0)
    weights = torch.randn(*batch["input_ids"].shape, language.lm_head.out_features).to(device)
    return model, language, batch, rows, weights


def _close(a, b, tol=1e-5):
    """Every tensor within fp32 rounding of its own scale (the largest entry)."""
    return all(float((x - y).abs().max()) <= tol * float(y.abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, kernel", [(n, "sdpa") for n in PACKING] + [("llava", "eager"), ("qwen2_vl", "eager")])
def test_per_sample_equals_the_block_diagonal_mask(name, kernel, device):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32's bar on a GPU
    model, language, batch, rows, weights = _case(name, kernel, device)
    assert any(pad for pad in batch["packed_segments"][1][-1:]) and sum(batch["packed_segments"][0]) == \
        batch["input_ids"].shape[1]
    want = _run(language, batch, rows, None, weights)  # transformers' mask over the whole row
    decoder = language.language_model
    switched = apply_per_sample_attention(decoder)
    assert switched == sum(map(calls_per_sample, decoder.modules())) >= 2
    assert decoder.config._attn_implementation == kernel  # the decoder's own config (its masks) untouched
    assert apply_per_sample_attention(decoder) == switched  # idempotent
    got = _run(language, batch, rows, batch["packed_segments"], weights)
    assert _close([got[0]], [want[0]]), float((got[0] - want[0]).abs().max())
    assert got[1].keys() == want[1].keys() and _close(got[1].values(), want[1].values())
    assert _close(got[2], want[2])
    # without segments: the model's own kernel on the decoder's mask, bit for bit
    plain = _run(language, batch, rows, None, weights)
    assert torch.equal(plain[0], want[0])
    # negative control: each row one segment, so attention crosses its samples
    joined = _run(language, batch, rows, tuple((sum(s),) for s in batch["packed_segments"]), weights)
    assert float((joined[0] - want[0]).abs().max()) > 1e-3


def test_segments_must_cover_the_row():
    model, language, batch, rows, weights = _case("llava")
    apply_per_sample_attention(language.language_model)
    short = (batch["packed_segments"][0][:-1], batch["packed_segments"][1])
    with pytest.raises(ValueError, match="packed_segments of row 0 cover"):
        language(batch["input_ids"], rows, None, batch["position_ids"], packed_segments=short)


def _text(kernel="sdpa", **kw):
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                         num_hidden_layers=2, vocab_size=128, **kw)
    config._attn_implementation_internal = kernel
    return config


def test_each_decoder_gets_its_mode():
    assert packed_attention_mode(_text(), None) == "per_sample"
    assert packed_attention_mode(_text("eager"), "per_sample") == "per_sample"
    assert packed_attention_mode(_text(), "row_mask") == "row_mask"
    assert packed_attention_mode(_text("flash_attention_2"), None) == "kernel"
    assert packed_attention_mode(_text("flash_attention_2"), "per_sample") == "kernel"
    sliding = _text(use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert packed_attention_mode(sliding, None) == "per_sample"  # the window applied inside each sample
    assert packed_attention_mode(sliding, "per_sample") == "per_sample"
    assert packed_attention_mode(sliding, "row_mask") == "row_mask"
    assert packed_attention_mode(_text(sliding_window=16), None) == "per_sample"  # set but not used


@pytest.mark.parametrize("config, choice, words", [
    (_text("flash_attention_2"), "row_mask", "scores each sample of a packed row alone"),
])
def test_a_choice_the_decoder_cannot_take_is_refused_by_name(config, choice, words):
    with pytest.raises(HeteroConfigError) as e:
        packed_attention_mode(config, choice)
    assert e.value.field == "hetero_parallel.packed_attention" and words in str(e.value)


def test_initialize_and_validate_refuse_it_before_any_collective():
    from ds_hetero.config import load_config
    from ds_hetero.toy import tiny_llava
    from ds_hetero.validation import check_all

    ds = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "hetero_parallel": {"language_batching": "packed", "packed_attention": "row_mask",
                              "stages": {"vision": {"dp": 4}, "language": {"dp": 4}}}}
    model = tiny_llava("clip", seed=0)
    check_all(load_config(ds, 4), model)  # sdpa takes either
    model.config.text_config._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(HeteroConfigError) as e:
        check_all(load_config(ds, 4), model)
    assert e.value.field == "hetero_parallel.packed_attention"


def test_the_registered_entries_name_their_kernel():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model, language, batch, rows, weights = _case("llava")
    apply_per_sample_attention(language.language_model)
    assert all(entry in ALL_ATTENTION_FUNCTIONS for entry in KERNELS.values())


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_a_kernel_not_switched_fails_on_the_empty_mask_instead_of_attending_across_samples(kernel):
    model, language, batch, rows, weights = _case("llava", kernel)
    with pytest.raises(RuntimeError):  # segments given, but the modules still call the plain kernel
        language(batch["input_ids"], rows, None, batch["position_ids"], packed_segments=batch["packed_segments"])


def _sliding_qwen2_vl(kernel):
    """The tiny Qwen2-VL with its second decoder layer a sliding-window layer (window 3, shorter than
    every sample), and its packed rows."""
    import copy

    from transformers import Qwen2VLForConditionalGeneration

    base, samples = FAMILIES["qwen2_vl"]()
    config = copy.deepcopy(base.config)
    text = config.text_config
    text.use_sliding_window, text.sliding_window = True, 3
    text.layer_types = ["full_attention", "sliding_attention"]
    torch.manual_seed(1)
    model = Qwen2VLForConditionalGeneration(config)
    model.config.text_config._attn_implementation_internal = kernel
    assert min(int(s["input_ids"].numel()) for s in samples) > 3
    adapter = adapter_for(model)
    language = adapter.split()["language"]
    batch = packed_language_inputs(adapter, [samples[:3], samples[3:]], multiple=8)
    rows = tuple(torch.cat(r) for r in _rows(adapter, samples))
    torch.manual_seed(0)
    weights = torch.randn(*batch["input_ids"].shape, language.lm_head.out_features)
    return language, batch, rows, weights


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_a_sliding_window_decoder_attends_per_sample_inside_its_window(kernel):
    """Per sample (now the default for sliding-window decoders) equals transformers' packed sliding-window
    mask over the whole row (`"row_mask"`), logits and every gradient; negative control: the window
    dropped (each sample plain causal) differs."""
    from ds_hetero.models.per_sample_attention import _per_sample

    language, batch, rows, weights = _sliding_qwen2_vl(kernel)
    want = _run(language, batch, rows, None, weights)  # transformers' block-diagonal sliding mask
    apply_per_sample_attention(language.language_model)
    got = _run(language, batch, rows, batch["packed_segments"], weights)
    assert _close([got[0]], [want[0]]) and _close(got[1].values(), want[1].values()) and _close(got[2], want[2])
    attend = _per_sample(kernel)  # the same entry with the layers' window withheld

    def windowless(module, *args, sliding_window=None, **kwargs):
        return attend(module, *args, **kwargs)

    from transformers import AttentionInterface

    AttentionInterface.register(KERNELS[kernel], windowless)
    try:
        far = _run(language, batch, rows, batch["packed_segments"], weights)
    finally:
        AttentionInterface.register(KERNELS[kernel], attend)
    assert float((far[0] - want[0]).abs().max()) > 1e-3
