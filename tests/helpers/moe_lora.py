"""PEFT LoRA on attention and on the fused experts of Qwen3-VL-MoE with ep, against the single-process PEFT model.

`train_moe_lora(rank, world_size, layout, zero_stage, control)`: the tiny Qwen3-VL-MoE with
`LoraConfig(target_modules=[q, k, v, o], target_parameters=[mlp.experts.gate_up_proj,
mlp.experts.down_proj], init_lora_weights=False)` (B random: every factor gets a gradient from step 1)
through `ds_hetero.initialize`, and a deep copy trained as a plain PEFT model on the same batches
(`model(**batch).loss`, the aux loss included; fp32, AdamW, clipping active), 3 steps: losses, norms and
every weight (the adapters of the experts gathered over ep), and the adapter `save_peft_adapter` writes
against the reference's. `control="contiguous_b"`: B's columns sliced as if each expert's were contiguous
(expert_parallel/lora.py `lora_b_outer`), which must miss the bar.
"""

from __future__ import annotations

import copy

import torch

from ds_hetero.testing.parity import full_named_parameters, max_rel_err
from tests.helpers.moe_parity import CLIP, make_batches, reference_train

TARGETS = dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
               target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])


def make_optimizer(params):  # eps 1e-4: see ds_hetero/testing/parity.py
    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)


def peft_moe(seed=7):
    from peft import LoraConfig, get_peft_model

    from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe

    torch.manual_seed(seed)  # PEFT draws the adapters from torch's generator
    return get_peft_model(tiny_qwen3_vl_moe(seed=seed), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                                   init_lora_weights=False, **TARGETS))


def train_moe_lora(rank, world_size, layout, zero_stage=0, control=None, steps=3, tmp=None, reload=None):
    """`reload` (another stage layout and ZeRO stage): after the steps, a training checkpoint loaded there,
    one more step against the reference continued as one uninterrupted run."""
    import ds_hetero
    from ds_hetero.expert_parallel import lora
    from ds_hetero.integrations.trainer.peft_adapter import save_peft_adapter

    model = peft_moe()
    reference = copy.deepcopy(model)
    uninterrupted = copy.deepcopy(model) if reload else None
    batches = make_batches(model, steps + (1 if reload else 0), 8)

    def config(layout, zero_stage):
        return {"train_batch_size": 8, "zero_optimization": {"stage": zero_stage}, "zero_allow_untested_optimizer": True,
                "gradient_clipping": CLIP, "steps_per_print": 10**6,
                "hetero_parallel": {"placement": "colocated", "micro_batches": 1, "stages": layout}}
    original = lora.lora_b_outer
    if control == "contiguous_b":
        lora.lora_b_outer = lambda r: 1
    try:
        engine = ds_hetero.initialize(model, config(layout, zero_stage), optimizer=make_optimizer)
    finally:
        lora.lora_b_outer = original
    results = [engine.train_batch(s) for s in batches[:steps]]
    got = full_named_parameters(engine)
    expert_lora = sum(1 for p in engine.model.parameters() if getattr(p, "expert_parallel", False) and p.requires_grad)
    saved = None
    if tmp is not None:
        save_peft_adapter(engine, model, tmp)
    moved = None
    if reload:
        engine.save_checkpoint(f"{tmp}_ckpt")
        engine.groups.destroy()
        engine = ds_hetero.initialize(peft_moe(seed=99), config(*reload), optimizer=make_optimizer)
        engine.load_checkpoint(f"{tmp}_ckpt")
        moved = {"loss": engine.train_batch(batches[steps]).loss, "weights": full_named_parameters(engine)}
    engine.groups.destroy()
    ref_losses, ref_norms, ref_aux = reference_train(reference, batches[:steps], make_optimizer, CLIP, 1)
    want = {n: p.detach() for n, p in reference.named_parameters()}
    base = {n.replace("base_model.model.", "", 1): p for n, p in want.items()}  # the engine holds the base model's names
    weights = got if set(got) == set(want) else {n: got[n] for n in base if n in got}
    if tmp is not None:
        import torch.distributed as dist
        from peft import PeftModel

        from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe

        dist.barrier()
        loaded = PeftModel.from_pretrained(tiny_qwen3_vl_moe(seed=7), tmp)
        adapters = {n: p.detach() for n, p in loaded.named_parameters() if "lora_" in n}
        saved = (max_rel_err(adapters, {n: want[n] for n in adapters}), len(adapters))
    if reload:
        final_losses = reference_train(uninterrupted, batches, make_optimizer, CLIP, 1)[0]
        final = {n.replace("base_model.model.", "", 1): p.detach() for n, p in uninterrupted.named_parameters()}
        moved = {"loss": (moved["loss"], final_losses[steps]),
                 "weight_err": max_rel_err({n: moved["weights"][n] for n in final if n in moved["weights"]}, final)}
    return {"reloaded": moved, "losses": [r.loss for r in results], "ref_losses": ref_losses, "aux": [r.aux_loss for r in results],
            "ref_aux": ref_aux, "norms": [r.grad_norm for r in results], "ref_norms": ref_norms,
            "weight_err": max_rel_err(weights, want if weights is got else base), "n_params": len(want), "expert_lora_params": expert_lora,
            "adapter": saved}


V = {"tp": 1, "dp": 4}
LORA = {  # the cases of tests/parallel/test_expert_parallel.py's launch
    # its training checkpoint then continues at ep4 ZeRO 2 (the experts' LoRA factors resharded over ep)
    "lora tp2 dp2 ep2 zero1": dict(layout={"vision": V, "language": {"tp": 2, "dp": 2, "ep": 2}}, zero_stage=1,
                                   reload=({"vision": V, "language": {"tp": 1, "dp": 4, "ep": 4}}, 2)),
    "lora dp4 ep4 zero2": dict(layout={"vision": V, "language": {"tp": 1, "dp": 4, "ep": 4}}, zero_stage=2),
}


def check_run(r, rtol, atol):
    """3 steps: losses `rtol`, norms 1e-4, every weight and the saved adapter `rtol`; the reloaded step."""
    assert r["expert_lora_params"] == 12  # A and B of gate_up_proj and down_proj in each of the 3 layers
    for got, want in zip(r["losses"], r["ref_losses"], strict=True):
        assert abs(got - want) <= rtol * abs(want), (r["losses"], r["ref_losses"])
    for got, want in zip(r["norms"], r["ref_norms"], strict=True):
        assert abs(got - want) <= 1e-4 * abs(want), (r["norms"], r["ref_norms"])
    err, where, abs_err, compared = r["weight_err"]
    assert compared == r["n_params"] and err <= rtol and abs_err <= atol, (err, where, abs_err, compared)
    err, where, _, compared = r["adapter"][0]
    assert compared == 36 and err <= rtol, (err, where)  # PeftModel.from_pretrained of save_peft_adapter's
    if r["reloaded"] is not None:  # the checkpoint at ep4: one more step as the uninterrupted reference's
        got, want = r["reloaded"]["loss"]
        err, where, abs_err, compared = r["reloaded"]["weight_err"]
        assert abs(got - want) <= rtol * abs(want) and compared == r["n_params"] and err <= rtol, r["reloaded"]
