"""Sharded Hugging Face modules equal their unsharded reference at tp 1, 2 and 4.

One 4-rank launch builds three layouts on the same ranks (tp1 x dp4, tp2 x dp2, tp4 x dp1) and,
for every family and tp, compares outputs, input gradients and every parameter's value and
gradient (shards gathered back) with the unsharded module on identical inputs (fp32).
"""

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

TPS = (1, 2, 4)
RTOL = 1e-5  # fp32; the observed errors are printed by test_report_tolerances (-s)


def _objective(*outs):
    """A scalar with a different weight per element, so every gradient entry matters."""
    import torch

    total = 0.0
    for i, o in enumerate(outs):
        gen = torch.Generator().manual_seed(100 + i)
        total = total + (o * torch.randn(o.shape, generator=gen)).sum()
    return total


def _lm_case(build, group, sequence_parallel=False, pad_vocab=False):
    import torch

    from ds_hetero.tensor_parallel import shard_language_model

    from ds_hetero.families import tp_plans
    from tests.helpers.tp_checks import gather_vocab, param_errors, rel_err, twin

    ref, model = twin(build)
    shard_language_model(model, group, sequence_parallel=sequence_parallel, pad_vocab=pad_vocab, plans=tp_plans())
    seen = []  # sequence length between blocks: 16 / tp under sequence parallelism, else 16
    model.get_decoder().layers[0].register_forward_hook(lambda mod, args, out: seen.append(out.shape[1]))
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, ref.get_output_embeddings().out_features, (2, 16), generator=gen)
    labels = ids.clone()
    labels[0, :3] = -100  # ignored positions take part too
    embeds = ref.get_input_embeddings()(ids).detach()
    e_ref, e = embeds.clone().requires_grad_(True), embeds.clone().requires_grad_(True)
    out_ref, out = ref(inputs_embeds=e_ref, labels=labels), model(inputs_embeds=e, labels=labels)
    out_ref.loss.backward()
    out.loss.backward()
    logits = out.logits if group.size() == 1 else gather_vocab(out.logits, model.lm_head, group)
    return dict(out=max(rel_err(out.loss.detach(), out_ref.loss.detach()), rel_err(logits, out_ref.logits.detach())),
                input_grad=rel_err(e.grad, e_ref.grad), seq_between_blocks=seen[0], **param_errors(ref, model, group))


def _vision_case(build_tower, group, projector=True):
    import torch

    from ds_hetero.tensor_parallel import shard_projector, shard_vision_tower

    from ds_hetero.families import tp_plans
    from tests.helpers.tp_checks import llava_projector, param_errors, rel_err, twin

    (ref_t, tower), (ref_p, proj) = twin(build_tower), twin(llava_projector)
    shard_vision_tower(tower, group, plans=tp_plans())
    shard_projector(proj, group, plans=tp_plans())
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    x_ref, x_tp = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    o_ref, o = ref_t(pixel_values=x_ref), tower(pixel_values=x_tp)
    y_ref, y = ref_p(o_ref.last_hidden_state), proj(o.last_hidden_state)
    _objective(y_ref, o_ref.pooler_output).backward()
    _objective(y, o.pooler_output).backward()
    errs = [param_errors(ref_t, tower, group), param_errors(ref_p, proj, group)]
    heads = [m.num_heads for n, m in tower.named_modules() if n.endswith("self_attn")]
    return dict(out=max(rel_err(y, y_ref), rel_err(o.pooler_output, o_ref.pooler_output)),
                input_grad=rel_err(x_tp.grad, x_ref.grad), local_heads=sorted(set(heads)),
                **{k: max(e[k] for e in errs) if k in ("value", "grad") else sum(e[k] for e in errs) for k in errs[0]})


def _qwen_vision_case(group):

    from ds_hetero.tensor_parallel import shard_vision_tower

    from ds_hetero.families import tp_plans
    from tests.helpers.tp_checks import param_errors, qwen2_vl, qwen_vision_inputs, rel_err, twin

    ref, visual = twin(lambda: qwen2_vl().model.visual)
    shard_vision_tower(visual, group, plans=tp_plans())
    pixels, grid = qwen_vision_inputs()
    p_ref, p = pixels.clone().requires_grad_(True), pixels.clone().requires_grad_(True)
    o_ref, o = ref(p_ref, grid_thw=grid), visual(p, grid_thw=grid)
    _objective(o_ref.pooler_output, o_ref.last_hidden_state).backward()
    _objective(o.pooler_output, o.last_hidden_state).backward()
    return dict(out=max(rel_err(o.pooler_output, o_ref.pooler_output),
                        rel_err(o.last_hidden_state, o_ref.last_hidden_state)),
                input_grad=rel_err(p.grad, p_ref.grad), local_heads=[visual.blocks[0].attn.num_heads],
                **param_errors(ref, visual, group))


def _qwen_text_case(group):
    """The Qwen2-VL language model (Qwen2VLTextModel + lm_head) through the full model, text only."""
    from tests.helpers.tp_checks import qwen2_vl

    return _lm_case(qwen2_vl, group)


def _families(group):
    from tests.helpers import tp_checks as m

    return {
        "llama": lambda: _lm_case(m.llama_lm, group),
        "qwen2": lambda: _lm_case(m.qwen2_lm, group),
        "llama+sp": lambda: _lm_case(m.llama_lm, group, sequence_parallel=True),
        "qwen2+sp": lambda: _lm_case(m.qwen2_lm, group, sequence_parallel=True),
        "llama+padded-vocab": lambda: _lm_case(lambda: m.llama_lm(vocab_size=254), group, pad_vocab=True),
        "qwen2-vl-text": lambda: _qwen_text_case(group),
        "clip+llava-projector": lambda: _vision_case(m.clip_tower, group),
        "siglip+llava-projector": lambda: _vision_case(m.siglip_tower, group),
        "qwen2-vl-vision+merger": lambda: _qwen_vision_case(group),
    }


FAMILIES = ["llama", "qwen2", "llama+sp", "qwen2+sp", "llama+padded-vocab", "qwen2-vl-text",
            "clip+llava-projector", "siglip+llava-projector", "qwen2-vl-vision+merger"]


def _family_checks(rank, world_size):
    from ds_hetero.topology.groups import build_groups
    from ds_hetero.layout import StageLayout

    layouts = {f"tp{t}": StageLayout(f"tp{t}", t, 1, 4 // t, (0, 1, 2, 3)) for t in TPS}
    groups = build_groups(layouts, rank)
    results = {}
    for t in TPS:
        for name, case in _families(groups.stages[f"tp{t}"].tp).items():
            results[f"{name}/tp{t}"] = case()
    return results


@pytest.fixture(scope="module")
def family_results():
    return run_distributed(_family_checks, world_size=4, timeout=170)


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_equals_unsharded(family_results, family, tp):
    for rank, res in enumerate(family_results):
        r = res[f"{family}/tp{tp}"]
        assert r["out"] <= RTOL and r["input_grad"] <= RTOL, (rank, r)
        assert r["value"] <= RTOL and r["grad"] <= RTOL, (rank, r)
        assert r["n_grads"] > 0
        # tp 1 leaves the modules alone; tp > 1 really shards (otherwise equality proves nothing)
        assert (r["n_sharded"] > 0) == (tp > 1), (rank, r)


@pytest.mark.parametrize("tp", TPS)
def test_sequence_parallel_shards_activations_between_blocks(family_results, tp):
    for res in family_results:
        assert res[f"llama+sp/tp{tp}"]["seq_between_blocks"] == 16 // tp
        assert res[f"qwen2+sp/tp{tp}"]["seq_between_blocks"] == 16 // tp
        assert res[f"llama/tp{tp}"]["seq_between_blocks"] == 16


@pytest.mark.parametrize("tp", TPS)
def test_attention_uses_local_head_counts(family_results, tp):
    for res in family_results:
        assert res[f"clip+llava-projector/tp{tp}"]["local_heads"] == [4 // tp]
        assert res[f"siglip+llava-projector/tp{tp}"]["local_heads"] == [4 // tp]
        assert res[f"qwen2-vl-vision+merger/tp{tp}"]["local_heads"] == [4 // tp]


def test_report_tolerances(family_results):
    worst = {k: max(max(res[k][m] for m in ("out", "input_grad", "value", "grad")) for res in family_results)
             for k in family_results[0]}
    for key, err in sorted(worst.items()):
        print(f"{key:34s} worst relative error {err:.2e}")
    assert max(worst.values()) <= RTOL
