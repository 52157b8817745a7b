"""Reference side of the checkpoint-layout tests: the full training state read from a *live*
engine (DeepSpeed's safe_get_full_* and an all-gather over tp, never the checkpoint files), and a
single-process Hugging Face run continued from such a state.

A checkpoint moved to another layout must continue exactly like this single-process run: it
starts from the same weights, Adam moments and step, on the same global batches.
"""

import torch

from ds_hetero.testing.parity import build_model, reference_train

LR = 1e-3


def make_optimizer(params):
    # eps 1e-4: see engine_parity.train_both (keeps Adam's amplification of rounding below fp32 noise)
    return torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)


def config(layout, zero, placement="colocated", batch_size=8, micro_batches=2):
    return {
        "train_batch_size": batch_size,
        "zero_optimization": {"stage": zero},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**6,
        "hetero_parallel": {"placement": placement, "micro_batches": micro_batches, "stages": layout},
    }


@torch.no_grad()
def live_full_state(engine):
    """{hf_name: {"fp32", "exp_avg", "exp_avg_sq", "step"}} of the stages (or pipeline chunks) whose
    first rank this is."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    from ds_hetero.tensor_parallel import gather_full

    hf_names = {id(p): n for n, p in engine.model.named_parameters()}
    out = {}
    for stage, e in engine.engines.items():
        tp_group = engine.groups[stage].tp
        zero = e.zero_optimization_stage()
        first = engine.rank == engine.stages[stage].norm_rank  # with a pipeline: its chunk's first rank
        if zero in (1, 2):
            # DeepSpeed 0.19 links each parameter's view of Adam's state right after the *first*
            # param group's first step, before the later groups have any state, so a second group
            # (a tied embedding copy's own group) would read as stateless; link again, now all have it
            e.optimizer._hp_optimizer_states_linked = False
            e.optimizer._lazy_init_hp_params_optimizer_state()
        for p in e.module.parameters():
            optimized = hasattr(p, "_hp_mapping") if zero else p in e.optimizer.state
            if not optimized:  # not in the optimizer (never gets a gradient): weights only
                entry = {"fp32": gather_full(p.detach(), p, tp_group)}
            elif zero:
                fp32 = safe_get_full_fp32_param(p)
                moments = {k: safe_get_full_optimizer_state(p, k) for k in ("exp_avg", "exp_avg_sq")}
                step = next(iter(e.optimizer.optimizer.state.values()))["step"]
            else:
                state = e.optimizer.state[p]
                fp32, moments, step = p.detach(), {k: state[k] for k in ("exp_avg", "exp_avg_sq")}, state["step"]
            if optimized:
                entry = {k: gather_full(v, p, tp_group) for k, v in dict(fp32=fp32, **moments).items()}
                entry["step"] = float(step)
            if first:
                out[hf_names[id(p)]] = entry
    return out


def continue_single_process(state, batches, family="llava", clip=1.0, moments=True, **model_kw):
    """Losses of a plain HF model + torch AdamW started from `state` (moments=False: a negative control)."""
    model = build_model(family, seed=123, **model_kw)  # other weights: the state must overwrite them all
    params = dict(model.named_parameters())
    assert set(params) == set(state), (set(params) ^ set(state))
    opt = make_optimizer(list(model.parameters()))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(state[name]["fp32"])
            if moments and "exp_avg" in state[name]:
                opt.state[p] = {"step": torch.tensor(state[name]["step"]),
                                "exp_avg": state[name]["exp_avg"].clone(),
                                "exp_avg_sq": state[name]["exp_avg_sq"].clone()}
    losses = reference_train(family, model, batches, lambda _: opt, clip)[0]
    return losses
