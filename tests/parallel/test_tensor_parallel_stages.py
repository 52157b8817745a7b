"""Whole multimodal models with a different tp per stage, and the configuration errors.

LLaVA: vision tower + projector at tp 4, language model at tp 2 with sequence parallelism.
Qwen2-VL: vision tower + merger at tp 2, language model at tp 4. Both on the same 4 ranks
(colocated), through the model's own forward with labels, against the unsharded model.
"""

import pytest

from ds_hetero import HeteroConfigError
from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

RTOL = 1e-5


def _full_model_case(build, batch, vision_group, language_group, sequence_parallel):
    from ds_hetero.tensor_parallel import shard_language_model, shard_projector, shard_vision_tower
    from ds_hetero.families import tp_plans
    from tests.helpers.tp_checks import gather_vocab, rel_err, twin

    ref, model = twin(build)
    inner = model.model
    if hasattr(inner, "visual"):
        shard_vision_tower(inner.visual, vision_group, plans=tp_plans())
    else:
        shard_vision_tower(inner.vision_tower, vision_group, plans=tp_plans())
        shard_projector(inner.multi_modal_projector, vision_group, plans=tp_plans())
    shard_language_model(model, language_group, sequence_parallel=sequence_parallel, plans=tp_plans())
    out_ref, out = ref(**batch), model(**batch)
    out_ref.loss.backward()
    out.loss.backward()
    logits = gather_vocab(out.logits, model.lm_head, language_group)
    return dict(loss=rel_err(out.loss.detach(), out_ref.loss.detach()), logits=rel_err(logits, out_ref.logits.detach()),
                **_stage_param_errors(ref, model, vision_group, language_group))


def _stage_param_errors(ref, model, vision_group, language_group):
    """Vision parameters gather over the vision tp group, language ones over the language group."""
    from tests.helpers.tp_checks import param_errors

    language = param_errors(ref.model.language_model, model.model.language_model, language_group)
    head = param_errors(ref.lm_head, model.lm_head, language_group)
    vision_parts = [("visual",)] if hasattr(model.model, "visual") else [("vision_tower",), ("multi_modal_projector",)]
    vision = [param_errors(getattr(ref.model, p[0]), getattr(model.model, p[0]), vision_group) for p in vision_parts]
    parts = [language, head, *vision]
    return dict(value=max(p["value"] for p in parts), grad=max(p["grad"] for p in parts),
                n_sharded_language=language["n_sharded"] + head["n_sharded"],
                n_sharded_vision=sum(v["n_sharded"] for v in vision))


def _error_case(build, group, **kwargs):
    """The error every rank raises, and whether the model was left untouched."""
    from ds_hetero.tensor_parallel import ColumnParallelLinear, shard_language_model
    from ds_hetero.families import tp_plans

    model = build()
    try:
        shard_language_model(model, group, **kwargs, plans=tp_plans())
        message = None
    except HeteroConfigError as exc:
        message = str(exc)
    untouched = not any(isinstance(m, ColumnParallelLinear) for m in model.modules())
    return message, untouched


def _stage_checks(rank, world_size):
    import torch.distributed as dist

    from ds_hetero.topology.groups import build_groups
    from ds_hetero.layout import StageLayout
    from tests.helpers import tp_checks as m
    from ds_hetero.testing.batches import collate, llava_samples

    ranks = (0, 1, 2, 3)
    groups = build_groups({"v4": StageLayout("v4", 4, 1, 1, ranks), "l2": StageLayout("l2", 2, 1, 2, ranks),
                           "v2": StageLayout("v2", 2, 1, 2, ranks), "l4": StageLayout("l4", 4, 1, 1, ranks),
                           "l1": StageLayout("l1", 1, 1, 4, ranks)}, rank)
    tp = {k: s.tp for k, s in groups.stages.items()}
    llava_batch = collate(llava_samples(m.llava(), 2))
    results = {
        "llava vision tp4 / language tp2+sp": _full_model_case(m.llava, llava_batch, tp["v4"], tp["l2"], True),
        "qwen2-vl vision tp2 / language tp4": _full_model_case(m.qwen2_vl, m.qwen_vl_batch(text_len=10),
                                                               tp["v2"], tp["l4"], False),
        "kv heads": _error_case(lambda: m.llama_lm(num_key_value_heads=2), tp["l4"]),
        "vocab": _error_case(lambda: m.llama_lm(vocab_size=250), tp["l4"]),
        "tied": _error_case(lambda: m.llama_lm(tie_word_embeddings=True), tp["l2"]),
        "tied at tp 1": _error_case(lambda: m.llama_lm(tie_word_embeddings=True), tp["l1"]),
    }
    dist.barrier()  # nobody was left inside a collective by the errors above
    return results


@pytest.fixture(scope="module")
def stage_results():
    return run_distributed(_stage_checks, world_size=4, timeout=170)


@pytest.mark.parametrize("case", ["llava vision tp4 / language tp2+sp", "qwen2-vl vision tp2 / language tp4"])
def test_stages_with_different_tp_equal_the_unsharded_model(stage_results, case):
    for rank, res in enumerate(stage_results):
        r = res[case]
        print(f"rank {rank} {case}: {r}")
        assert max(r["loss"], r["logits"], r["value"], r["grad"]) <= RTOL, (rank, r)
        assert r["n_sharded_language"] > 0 and r["n_sharded_vision"] > 0


@pytest.mark.parametrize("case, needle", [
    ("kv heads", "tp=4 does not divide the key/value heads (2) of LlamaAttention at 'layers.0.self_attn'"),
    ("vocab", "tp=4 does not divide the vocabulary (250)"),
])
def test_errors_are_raised_identically_on_every_rank_before_any_change(stage_results, case, needle):
    messages = {res[case][0] for res in stage_results}
    assert len(messages) == 1, messages
    message = messages.pop()
    assert message is not None and needle in message, message
    assert "stages.language.tp" in message
    assert all(res[case][1] for res in stage_results), "the model was modified before the error"


def test_tied_embeddings_are_accepted_at_every_tp(stage_results):
    # tp 2 shards the tied weight once (tests/parallel/test_vocab_embedding.py checks the values); tp 1 changes nothing
    assert all(res["tied"] == (None, False) for res in stage_results)
    assert all(res["tied at tp 1"] == (None, True) for res in stage_results)


# ------------------------------------------------------------------ pure checks, no processes
def test_validation_names_module_and_numbers():
    from ds_hetero.tensor_parallel import validate_tensor_parallel
    from ds_hetero.families import tp_plans
    from tests.helpers import tp_checks as m

    with pytest.raises(HeteroConfigError, match=r"tp=3 does not divide the attention heads \(8\) of LlamaAttention"):
        validate_tensor_parallel(m.llama_lm().model, 3, stage="language", plans=tp_plans())
    with pytest.raises(HeteroConfigError, match=r"width of gate_proj \(130\) of LlamaMLP at 'layers.0.mlp'; "
                                                r"tp sizes that would: \[1, 2, 5, 10, 13, 26, 65, 130\]"):
        validate_tensor_parallel(m.llama_lm(intermediate_size=130).model, 4, stage="language", plans=tp_plans())
    with pytest.raises(HeteroConfigError, match=r"stages.vision.tp.*attention heads \(4\) of CLIPAttention"):
        validate_tensor_parallel(m.clip_tower(), 8, stage="vision", plans=tp_plans())
    with pytest.raises(HeteroConfigError, match=r"attention heads \(4\) of VisionAttention"):
        validate_tensor_parallel(m.qwen2_vl().model.visual, 8, stage="vision", plans=tp_plans())


def test_unknown_module_is_rejected():
    import torch

    from ds_hetero.families import tp_plans
    from ds_hetero.tensor_parallel import validate_tensor_parallel

    with pytest.raises(HeteroConfigError, match="no tensor-parallel plan matches any module of Sequential"):
        validate_tensor_parallel(torch.nn.Sequential(torch.nn.Linear(4, 4)), 2, plans=tp_plans())
