"""Shared by tests/engine/test_equal_replicas.py: every rank builds other initial weights (a script that
seeds per rank, e.g. ms-swift's `seed + rank`), and ds_hetero must train rank 0's model, as stock
DeepSpeed does. `train_both` copies the reference before `rank_model` changes this rank's model,
so the reference is rank 0's model (seed 7; rank r's model is built with seed 7 + r)."""

import torch

from ds_hetero.testing.parity import build_model, train_both

CLIP = 0.3
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "gate_proj", "up_proj", "down_proj",
                "fc1", "fc2"]
LORA_SEED = 11


def reseed_whole(family, model_kw=None):
    """rank_model: this rank's whole model as a script seeding `7 + rank` builds it."""

    def rank_model(model, rank):
        if rank:
            other = build_model(family, seed=7 + rank, **(model_kw or {}))
            model.load_state_dict(other.state_dict())

    return rank_model


def add_lora(model):
    """prepare: PEFT LoRA adapters on every attention and MLP linear (B non-zero, so A trains from
    step 1), injected in place into `model` (the reference is copied after this)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(LORA_SEED)
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, lora_dropout=0.0,
                                     init_lora_weights=False))


def reseed_lora(model, rank):
    """rank_model: only the LoRA adapters differ per rank, drawn as PEFT draws them
    (`init_lora_weights=False`: nn.Linear's own init of A and B) under `seed + rank`."""
    if not rank:
        return
    torch.manual_seed(LORA_SEED + rank)
    for module in model.modules():
        if hasattr(module, "lora_A") and hasattr(module, "lora_B"):
            for adapter in list(module.lora_A):
                module.lora_A[adapter].reset_parameters()
                module.lora_B[adapter].reset_parameters()


def run(rank, world_size, runs):
    """{name: train_both(...)}; a run with `equalize=False` skips the equalization (negative control)."""
    import ds_hetero.stages.build as build

    out = {}
    for name, kw in runs.items():
        kw = {"steps": 3, "clip": CLIP, **kw}
        equalize = kw.pop("equalize", True)
        right = build.start_equal
        if not equalize:
            build.start_equal = lambda *args, **kwargs: None
        try:
            out[name] = train_both(rank, world_size, kw.pop("family", "llava"), **kw)
        finally:
            build.start_equal = right
    return out
