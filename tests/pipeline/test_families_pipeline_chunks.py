"""Every model family's language stage cut into pipeline chunks, without processes.

The chunks run one after the other give the pp-1 language stage's logits and boundary-row gradients
exactly, for every family (Gemma 3's image blocks and sliding layers, Qwen3-VL's DeepStack levels,
Qwen2.5-Omni's TMRoPE positions and two encoders' rows, InternVL, LLaVA-OneVision, Qwen2.5-VL, an
InternVL whose Qwen2 decoder has a sliding-window layer, and Gemma 4, whose per-layer inputs and
stored keys and values travel with the hidden states, and a Gemma 4 with neither), on cuts that put each family's per-
layer settings off their pp-1 position. Negative controls, one per mechanism: a chunk that reads the
whole decoder's `layer_types` at its own layer positions (Gemma 3, and the sliding Qwen2 decoder), a
Gemma 3 chunk whose mask is left causal, a Gemma 4 chunk given zeros for its per-layer inputs or for
the stored keys and values, and a Qwen3-VL cut with a DeepStack layer outside the first
chunk (which the model check refuses), each give different logits. The refusal is a
HeteroConfigError naming `pp_layers`, from the checks `ds-hetero validate` and `initialize` share
(validation.py::check_all), and the planner's cached layout verdicts keep cuts apart (a refused
cut refuses no other).
"""

import pytest
import torch

from ds_hetero.config import load_config
from ds_hetero.pipeline_parallel.cut import layer_cut
from ds_hetero.errors import HeteroConfigError
from ds_hetero.families import adapter_for
from ds_hetero.pipeline_parallel import chunk as pipeline_module
from ds_hetero.models.adapter import placeholder_mask
from ds_hetero.pipeline_parallel.chunk import PipelineChunk
from ds_hetero.validation import check_all


def _sliding_internvl(seed):
    """A tiny InternVL whose Qwen2 decoder has a sliding-window (4) second layer: Qwen2's own
    `use_sliding_window` / `max_window_layers`, the first layer full."""
    import copy

    from transformers import InternVLForConditionalGeneration

    from ds_hetero.toy import tiny_internvl

    config = copy.deepcopy(tiny_internvl().config)
    text = config.text_config
    text.use_sliding_window, text.sliding_window, text.max_window_layers = True, 4, 1
    text.layer_types = ["full_attention", "sliding_attention"]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return InternVLForConditionalGeneration(config)


def _family(family):
    """(model, language stage, its batch, one rows tensor per encoder) of a tiny seeded model."""
    if family == "omni":
        from ds_hetero.testing.parity import build_model, make_batches

        model = build_model("omni", seed=3)
        samples = make_batches("omni", model, 1, 4)[0]
    elif family.startswith("gemma4"):  # images, audio clips, both and neither
        from ds_hetero.toy import tiny_gemma4
        from tests.helpers.gemma4_parity import make_gemma4_batches

        # gemma4_plain: no per-layer inputs and no shared keys and values (Gemma 4's large models): nothing carried
        plain = dict(kv_shared_layers=0, per_layer_hidden=0) if family == "gemma4_plain" else {}
        model = tiny_gemma4(seed=3, **plain)
        samples = make_gemma4_batches(model, 1, 4)[0]
    else:
        from ds_hetero import toy as tiny_families
        from tests.helpers.family_parity import make_batches

        if family == "internvl_sliding":
            model, family = _sliding_internvl(seed=3), "internvl"
        else:
            model = getattr(tiny_families, f"tiny_{family}")(seed=3)
        samples = make_batches(family, model, 1, 4)[0]
    adapter = adapter_for(model)
    batch = adapter.language_inputs(samples)
    whole = adapter.split()["language"]
    gen = torch.Generator().manual_seed(0)
    rows = tuple(torch.randn(int(placeholder_mask(batch["input_ids"], ids).sum()), adapter.hidden_size,
                             generator=gen).requires_grad_(True) for ids in whole.token_ids)
    return model, whole, batch, rows


def _run_chunks(whole, batch, rows, counts, n_layers):
    cut = layer_cut(n_layers, len(counts), tuple(counts))
    args = (batch["attention_mask"], batch["position_ids"])
    x = batch["input_ids"]
    for k in range(len(counts)):
        chunk = PipelineChunk(whole, k, len(counts), cut[k])
        x = chunk(x, rows if k == 0 else (), *args, input_ids=batch["input_ids"])
    return x


CUTS = [("gemma3", (1, 2)), ("gemma3", (2, 1)), ("gemma3", (1, 1, 1)), ("qwen3_vl", (2, 1)),
        ("omni", (1, 1)), ("internvl", (1, 1)), ("internvl_sliding", (1, 1)), ("llava_onevision", (1, 1)), ("qwen2_5_vl", (1, 1)),
        ("qwen3_5", (1, 3)), ("qwen3_5", (3, 1)), ("qwen3_5", (2, 1, 1)),
        # Gemma 4 (4 layers: 0, 1 store the sliding / full keys and values that 2, 3 reuse): every cut
        # carries per-layer inputs, and each carries one or both stored keys and values
        ("gemma4", (1, 3)), ("gemma4", (2, 2)), ("gemma4", (3, 1)), ("gemma4", (1, 1, 1, 1)), ("gemma4_plain", (2, 2))]


@pytest.mark.parametrize("family,counts", CUTS)
def test_chunks_compose_to_the_family_language_stage(family, counts):
    model, whole, batch, rows = _family(family)
    args = (batch["attention_mask"], batch["position_ids"])
    want = whole(batch["input_ids"], rows, *args)
    if family == "gemma4_plain":
        assert whole.carried_width(2) == 0
    got = _run_chunks(whole, batch, rows, counts, model.config.text_config.num_hidden_layers)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, rows, g), torch.autograd.grad(want, rows, g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_gemma3_chunk_reading_the_whole_layer_types_differs(monkeypatch):
    """Negative control of `chunk_config`: the second chunk of [1, 2] holds a full then a sliding
    layer; read at positions 0, 1 of the whole decoder's types it would mask them the other way."""
    model, whole, batch, rows = _family("gemma3")
    want = whole(batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    monkeypatch.setattr(pipeline_module, "chunk_config", lambda config, layers: config)
    got = _run_chunks(whole, batch, rows, (1, 2), 3)
    assert not torch.allclose(got, want, rtol=1e-3, atol=1e-3)


def test_qwen2_sliding_layer_chunk_reading_the_whole_layer_types_differs(monkeypatch):
    """The same for a Qwen2 decoder (InternVL's) whose second layer is a sliding-window one: alone
    in the second chunk, it would take the first layer's full mask."""
    model, whole, batch, rows = _family("internvl_sliding")
    assert batch["input_ids"].shape[1] > 4  # longer than the window: the masks differ
    want = whole(batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    monkeypatch.setattr(pipeline_module, "chunk_config", lambda config, layers: config)
    got = _run_chunks(whole, batch, rows, (1, 1), 2)
    assert not torch.allclose(got, want, rtol=1e-3, atol=1e-3)


def test_gemma3_chunks_with_a_causal_image_mask_differ(monkeypatch):
    """Negative control of `decoder_mask`: chunks that leave the image blocks causal (the plain
    decoder's mask, as PipelineChunk built it before) do not compose to the Gemma 3 stage."""
    from ds_hetero.models.language_stage import LanguageStage

    model, whole, batch, rows = _family("gemma3")
    want = whole(batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    monkeypatch.setattr(type(whole), "decoder_mask", LanguageStage.decoder_mask)
    got = _run_chunks(whole, batch, rows, (2, 1), 3)
    assert not torch.allclose(got, want, rtol=1e-3, atol=1e-3)


def _config(stages):
    return load_config({"train_batch_size": 16, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                        "hetero_parallel": {"micro_batches": 4, "stages": stages}}, 4)


def test_qwen3_vl_deepstack_layer_outside_the_first_chunk_is_refused():
    """Tiny Qwen3-VL: DeepStack levels after decoder layers 0 and 1 of 3. The cut [1, 2] puts layer 1
    in the second chunk, which never receives the levels: refused by the model check naming
    pp_layers; composed anyway, the chunks give other logits (why it is refused)."""
    model, whole, batch, rows = _family("qwen3_vl")
    with pytest.raises(HeteroConfigError, match=r"pp_layers.*DeepStack.*pp_layers\[0\] >= 2"):
        check_all(_config({"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2, "pp_layers": [1, 2]}}), model)
    check_all(_config({"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2, "pp_layers": [2, 1]}}), model)
    check_all(_config({"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}), model)  # even cut: [2, 1]
    want = whole(batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    got = _run_chunks(whole, batch, rows, (1, 2), 3)
    assert not torch.allclose(got, want, rtol=1e-3, atol=1e-3)


def test_planner_layout_cache_keeps_the_deepstack_cut_apart():
    """The planner caches the adapter's verdict per layout: a refused cut must not refuse another
    cut (or pp 1) with the same tp / cp sizes, nor an accepted one let a refused cut through."""
    from ds_hetero.toy import tiny_qwen3_vl
    from ds_hetero.planner.validity import check_candidate

    adapter, cache = adapter_for(tiny_qwen3_vl()), {}

    def ds(language):
        return {"train_batch_size": 16, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                "hetero_parallel": {"micro_batches": 4, "stages": {"vision": {"dp": 4}, "language": language}}}

    check_candidate(ds({"dp": 2, "pp": 2, "pp_layers": [2, 1]}), 4, adapter, layout_cache=cache)
    with pytest.raises(HeteroConfigError, match="DeepStack"):
        check_candidate(ds({"dp": 2, "pp": 2, "pp_layers": [1, 2]}), 4, adapter, layout_cache=cache)
    check_candidate(ds({"dp": 4}), 4, adapter, layout_cache=cache)


@pytest.mark.parametrize("zeroed", ["per-layer inputs", "shared keys and values"])
def test_gemma4_chunks_without_their_carry_differ(monkeypatch, zeroed):
    """Negative controls of Gemma 4's carry (families/gemma4/pipeline_carry.py): at the cut [2, 2] the
    second chunk given zeros for the per-layer inputs of its layers, or for the keys and values layers 0
    and 1 stored, gives other logits; the carry is as wide as both ([b, s, 2 d + 2 (key widths of layers 0, 1)])."""
    from ds_hetero.families.gemma4.pipeline_carry import Gemma4Carry

    model, whole, batch, rows = _family("gemma4")
    want = whole(batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    d = model.config.text_config.hidden_size_per_layer_input
    stored = sum(whole.language_model.layers[i].self_attn.k_proj.out_features for i in (0, 1))
    assert whole.carried_width(2) == 2 * d + 2 * stored
    own = Gemma4Carry.carry

    def zeros(self, state, layers):
        out = own(self, state, layers)
        keep = torch.ones(out.shape[-1])
        keep[: 2 * d] = zeroed != "per-layer inputs"
        keep[2 * d:] = zeroed == "per-layer inputs"
        return out * keep

    monkeypatch.setattr(Gemma4Carry, "carry", zeros)
    got = _run_chunks(whole, batch, rows, (2, 2), 4)
    assert not torch.allclose(got, want, rtol=1e-3, atol=1e-3)
