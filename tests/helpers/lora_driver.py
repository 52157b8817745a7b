"""Run under `deepspeed --num_gpus 4` by tests/parallel/test_lora.py: a PEFT LoRA model (tiny LLaVA, adapters on
every attention and MLP linear of the tower and the decoder, B initialised non-zero) trained with
ds_hetero in three layouts, against a single-process PEFT reference on the same global batches.

    deepspeed --num_gpus 4 tests/helpers/lora_driver.py OUT_DIR

Per layout, every rank: 3 steps through `ds_hetero.initialize(peft_model, ...)`, the adapter saved
with `save_peft_adapter`; rank 0 then trains the reference (the same seeded base model and LoRA
init, `model(**batch).loss`, AdamW, clipping 1.0) and loads the saved adapter with
`PeftModel.from_pretrained`, comparing every LoRA tensor. Each rank writes OUT_DIR/rank<r>.json.
"""

import copy
import json
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.helpers.driver_report import run_driver, write_report  # noqa: E402

STEPS, BATCH, CLIP = 3, 8, 1.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "gate_proj", "up_proj", "down_proj", "fc1", "fc2"]
LAYOUTS = {
    "v_dp4__l_tp2dp2": ("colocated", {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}),
    "v_tp2dp2__l_tp4": ("colocated", {"vision": {"tp": 2, "dp": 2}, "language": {"tp": 4, "dp": 1}}),
    "disagg_v_dp2__l_tp2": ("disaggregated", {"vision": {"tp": 1, "dp": 2}, "language": {"tp": 2, "dp": 1}}),
}


def _optimizer(params):
    import torch

    # eps 1e-4: see tests/engine_parity.py (Adam would amplify fp32 reduction-order noise otherwise)
    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)


def lora_model(seed=7):
    import torch
    from peft import LoraConfig, get_peft_model

    from ds_hetero.toy import tiny_llava

    base = tiny_llava("clip", seed=seed, text_heads=4, text_kv_heads=4)  # kv heads divisible by tp 4
    torch.manual_seed(11)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False)
    return get_peft_model(base, config)


def run_layout(out, name, placement, stages):
    import torch
    from peft import PeftModel

    import ds_hetero
    from ds_hetero.integrations.trainer.peft_adapter import save_peft_adapter
    from ds_hetero.testing.parity import make_batches, max_rel_err, reference_train

    peft = lora_model()
    reference = copy.deepcopy(peft)
    batches = make_batches("llava", peft.get_base_model(), STEPS, BATCH)
    config = {"train_batch_size": BATCH, "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
              "gradient_clipping": CLIP, "steps_per_print": 10**6,
              "hetero_parallel": {"placement": placement, "micro_batches": 2, "stages": stages}}
    engine = ds_hetero.initialize(peft, config, optimizer=_optimizer)
    in_optimizer = {s: sum(p.numel() for g in e.optimizer.param_groups for p in g["params"])
                    for s, e in engine.engines.items()}
    trainable = {}
    for s, e in engine.engines.items():
        module = e.module
        params = module.trainable_parameters() if hasattr(module, "trainable_parameters") else \
            [p for p in module.parameters() if p.requires_grad]
        trainable[s] = sum(p.numel() for p in params)
    frozen_ok = all("lora_" in n for n, p in engine.model.named_parameters() if p.requires_grad)
    dp = {s: engine.config.stages[s].dp for s in engine.engines}
    results = [engine.train_batch(b) for b in batches]
    adapter_dir = os.path.join(out, name)
    save_peft_adapter(engine, peft, adapter_dir)
    report = {"losses": [r.loss for r in results], "grad_norms": [r.grad_norm for r in results],
              "in_optimizer": in_optimizer, "trainable": trainable, "dp": dp, "only_lora_trainable": frozen_ok}
    if os.environ["RANK"] != "0":
        return report
    # the single-process PEFT reference: the same seeded base + LoRA init, HF's own forward
    ref_losses, ref_norms, hf_losses = reference_train("llava", reference.get_base_model(), batches, _optimizer, CLIP)
    loaded = PeftModel.from_pretrained(_fresh_base(), adapter_dir)
    got = {n: p.detach() for n, p in loaded.named_parameters() if "lora_" in n}
    want = {n: p.detach() for n, p in reference.named_parameters() if "lora_" in n}
    initial = {n: p.detach() for n, p in lora_model().named_parameters() if "lora_" in n}
    lora_total = sum(p.numel() for n, p in reference.named_parameters() if "lora_" in n)
    report.update(ref_losses=ref_losses, ref_norms=ref_norms, hf_losses=hf_losses,
                  adapter_err=max_rel_err(got, want)[:4:2] + (len(got), len(want)),
                  moved_err=max_rel_err(initial, want)[0], lora_total=lora_total,
                  files=sorted(os.listdir(adapter_dir)))
    return report


def _fresh_base():
    from ds_hetero.toy import tiny_llava

    return tiny_llava("clip", seed=7, text_heads=4, text_kv_heads=4)


def main(out):
    report = {}
    try:
        for name, (placement, stages) in LAYOUTS.items():
            report[name] = run_layout(out, name, placement, stages)
    except Exception:
        report["crash"] = traceback.format_exc()
    return write_report(out, report)


if __name__ == "__main__":
    run_driver(main)
