"""Qwen3.5-MoE split into stages reproduces the fused Hugging Face model with its own loss (float64).

The split's logits, its loss (the lm loss plus router_aux_loss_coef x the aux loss, as the model adds it
with output_router_logits) and every gradient equal the fused model's; the split's loss without the aux
term is the negative control. The multi-process tests are in tests/parallel/test_expert_parallel.py.
"""

from ds_hetero.families import adapter_for
from ds_hetero.testing.batches import qwen_samples
from tests.helpers.family_data import QWEN25_GRIDS, qwen_multi_samples


def _qwen3_5_moe_grads(model, adapter, samples, with_aux=True):
    """(the split's loss, logits and every gradient) with the loss the model adds: the lm loss plus
    router_aux_loss_coef x the aux loss of the forward's router logits (one process: no groups)."""
    from ds_hetero.expert_parallel.aux_loss import global_aux_term

    model.zero_grad(set_to_none=True)
    batch, vision = adapter.language_inputs(samples), adapter.vision_inputs(samples)
    stages = adapter.split()
    rows = stages["vision"](**{k: (v.to(model.dtype) if v.is_floating_point() else v) for k, v in vision.items()})
    logits = stages["language"](batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    t = model.config.text_config
    loss = model.loss_function(logits=logits, labels=batch["labels"], vocab_size=t.vocab_size)
    pending = stages["language"].router_logits
    if with_aux:
        loss = loss + t.router_aux_loss_coef * global_aux_term(pending.logits, pending.mask, pending.top_k,
                                                               pending.num_experts, ())
    loss.backward()
    return loss, logits, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_qwen3_5_moe_split_equals_fused_with_experts_shared_expert_and_aux_loss():
    """Qwen3.5-MoE (Qwen3.5's layers, a MoE block with a shared expert in each): the split's logits, its
    loss with the aux loss (`model(**batch).loss`, output_router_logits on) and every gradient (router,
    experts, shared expert and its gate included) equal the fused model's, 0, 1 or 2 images per sample.
    Negative control: the split without the aux term misses the router's gradients."""
    from ds_hetero.families.qwen3_5_moe import Qwen3_5MoeAdapter
    from ds_hetero.toy import tiny_qwen3_5_moe
    from tests.helpers.moe_parity import hf_forward

    model = tiny_qwen3_5_moe(seed=2).double()
    model.set_experts_implementation("eager")  # transformers' default grouped_mm takes no float64
    adapter = adapter_for(model)
    assert isinstance(adapter, Qwen3_5MoeAdapter) and adapter.has_aux_loss
    samples = qwen_samples(model, QWEN25_GRIDS[:3]) + qwen_multi_samples(model, [[(1, 8, 8), (1, 4, 4)], []], seed=1)
    out = hf_forward(model, adapter, samples)
    out.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert float(out.aux_loss) > 0 and all(g is not None for g in want.values())
    loss, logits, got = _qwen3_5_moe_grads(model, adapter, samples)
    mask = adapter.language_inputs(samples)["attention_mask"].bool()
    assert float((logits[mask] - out.logits[mask]).detach().abs().max()) < 1e-12
    assert abs(float(loss) - float(out.loss)) < 1e-12
    assert set(got) == set(want)

    def rel(grads, names):
        return max(float((grads[n] - want[n]).abs().max() / want[n].abs().max()) for n in names)
    # 1e-5 relative, not 1e-12: the two losses' aux terms sum in other orders (1e-16 apart), and parts of
    # the HF model run in float32 inside the float64 model (the router's softmax; the Gated DeltaNet's decay
    # from A_log and dt_bias, `.float()`), so those 1e-16 become float32 roundings of the gradients there
    # (measured 1.5e-6 on dt_bias and A_log, 5e-7 with a float64 router; the logits and loss to 1e-12)
    assert rel(got, want) < 1e-5, rel(got, want)
    _, _, lm_only = _qwen3_5_moe_grads(model, adapter, samples, with_aux=False)
    router = [n for n in want if n.endswith("mlp.gate.weight")]
    assert len(router) == 4 and rel(lm_only, router) > 1e-3, rel(lm_only, router)


def test_planner_counts_the_parameters_of_full_size_configs():
    """ds_configs/planner/qwen3_5_9b.json and qwen3_5_35b_a3b.json (transformers' default Qwen3.5 and
    Qwen3.5-MoE shapes: 32 and 40 layers, 256 experts top-8 with a shared expert): the planner's count
    equals the model's, built on the meta device; per ep rank it holds E / ep of the routed experts."""
    import pathlib

    from ds_hetero.planner.model_source import load_hf_config, meta_model
    from ds_hetero.planner.model_spec import model_spec

    root = pathlib.Path(__file__).resolve().parents[2] / "ds_configs" / "planner"
    for name in ("qwen3_5_9b.json", "qwen3_5_35b_a3b.json"):
        config = load_hf_config(str(root / name))
        spec, stages = model_spec(config), adapter_for(meta_model(config)).split()
        for stage in ("vision", "language"):
            assert spec.stage_params(stage) == sum(p.numel() for p in stages[stage].parameters()), (name, stage)
    lm = spec.language  # the MoE: 35.1e9 parameters, 32.2e9 of them routed experts
    assert round(spec.params() / 1e9, 1) == 35.1 and round(lm.expert_params() / 1e9, 1) == 32.2
    assert lm.params_per_rank(1, 8) == lm.params() - lm.expert_params() + lm.expert_params() // 8
