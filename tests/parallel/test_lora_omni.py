"""LoRA (PEFT layers injected into the Qwen2.5-Omni thinker) in every encoder and the language stage,
each split with its own stage's tp, against the single-process thinker with the same adapters (one
launch of 4 CPU ranks, fp32, 3 steps, clipping active, the thinker's own `model(**batch).loss`):

    colocated  vision tp2 dp2 + audio tp2 dp2 + language tp2 dp2   (adapters split in all three)
    mixed      vision dp2 on the language ranks 0-1 + audio tp2 on ranks 2-3 + language tp2

Only LoRA weights train (the base is frozen in both); losses, norms and every weight within 1e-5.
Negative control: the trained LoRA weights are far from their initial values (the comparison
covers them: a run that did not train them could not pass).
"""

import pytest

from ds_hetero.testing.launch import run_distributed
from ds_hetero.testing.parity import train_both

pytestmark = pytest.mark.distributed

RTOL, ATOL, CLIP = 1e-5, 1e-6, 0.3
# attention and MLP linears of the audio encoder (q/k/v/out_proj, fc1/fc2), the vision tower
# (attn.q/k/v/proj, gate/up/down) and the decoder (q/k/v/o, gate/up/down): all planned for tp
TARGETS = r".*\.(q_proj|k_proj|v_proj|o_proj|out_proj|fc1|fc2|gate_proj|up_proj|down_proj|attn\.q|attn\.k|attn\.v|attn\.proj)"
RUNS = {
    "colocated vision tp2dp2 + audio tp2dp2 + language tp2dp2": dict(
        layout={"vision": {"tp": 2, "dp": 2}, "audio": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}}),
    "mixed vision dp2 [0,1] + audio tp2 [2,3] + language tp2 [0,1]": dict(
        layout={"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"tp": 2, "dp": 1, "ranks": [2, 3]},
                "language": {"tp": 2, "dp": 1, "ranks": [0, 1]}}, placement="mixed"),
}


def _inject(model):
    import torch
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(11)  # B non-zero from the start, so A's gradients count from step 1
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0,
                                       init_lora_weights=False), model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)


def _moved(engine, initial, got, results):
    from ds_hetero.testing.parity import max_rel_err

    lora = {n: w for n, w in initial.items() if "lora_" in n}
    stages = {s for s in ("audio_tower", "visual", "language_model") for n in got if "lora_" in n and s in n}
    return {"moved": max_rel_err({n: w for n, w in got.items() if n in lora}, lora),
            "lora_stages": sorted(stages),
            "trainable": sum(p.requires_grad for _, p in engine.model.named_parameters())}


def _suite(rank, world_size):
    return {name: train_both(rank, world_size, "omni", steps=3, clip=CLIP, zero_stage=1, prepare=_inject,
                             after=_moved, **kw) for name, kw in RUNS.items()}


def test_lora_in_every_encoder_matches_the_single_process_thinker():
    for rank, per_rank in enumerate(run_distributed(_suite, world_size=4, timeout=900)):
        for name, r in per_rank.items():
            for got, hf in zip(r["losses"], r["hf_losses"]):
                assert abs(got - hf) <= RTOL * abs(hf), (rank, name, r["losses"], r["hf_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
            assert min(r["ref_norms"]) > CLIP
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0 and err <= RTOL and abs_err <= ATOL, (rank, name, err, where, abs_err)
            moved, _, _, n_lora = r["moved"]
            assert n_lora > 0 and moved > 100 * RTOL, (rank, name, r["moved"])  # the LoRA weights trained
        # the adapters of every stage this rank holds were compared (colocated: all three; mixed:
        # vision and language on ranks 0-1, audio on 2-3)
        colocated, mixed = (per_rank[n]["lora_stages"] for n in RUNS)
        assert colocated == ["audio_tower", "language_model", "visual"], colocated
        assert mixed == (["language_model", "visual"] if rank < 2 else ["audio_tower"]), (rank, mixed)
