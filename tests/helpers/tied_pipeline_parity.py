"""Shared by the tied-embedding pipeline tests: layouts of a tied model with a pipelined language
stage trained against the single-process Hugging Face reference, both copies of the tied weight,
and the negative controls."""

from tests.helpers.pipeline_parity import FOUR_LAYERS, bf16_losses, run_layouts

TIED = {**FOUR_LAYERS, "tie_word_embeddings": True}
TIED_NAME = {"llava": "model.language_model.embed_tokens.weight", "qwen2_vl": "model.language_model.embed_tokens.weight"}


def tied_copies(family):
    """`after` hook: this rank's copy of the tied weight (full, gathered over tp) as plain numbers,
    with whether it is the head's copy (last pipeline stage); None where the rank holds neither."""
    def after(engine, initial, got, results):
        language = engine.stages.language
        copy = language.tied if language.held else None
        if copy is None:
            return {"tied_copy": None}
        return {"tied_copy": dict(shared=copy.shared, value=got[TIED_NAME[family]].tolist(),
                                  own_group=_own_param_group(language.engine, copy.param))}
    return after


def _own_param_group(engine, param):
    """Whether the optimizer holds the copy in a param group of its own (what ZeRO 1/2 need):
    ZeRO 1/2's flattened groups, or a ZeRO-0 torch optimizer's param groups."""
    opt = engine.optimizer
    groups = getattr(opt, "bit16_groups", None) or [g["params"] for g in opt.param_groups]
    return any(len(g) == 1 and g[0] is param for g in groups)


def _no_tied_sum(engine, batches):
    """Negative control: the copies' gradients are not summed over the embedding group."""
    from ds_hetero.schedule import pipeline

    pipeline.reduce_tied_gradients = lambda stage: None
    return {}


def _norm_counts_both(engine, batches):
    """Negative control: the head's copy is counted in the gradient norm too (the tie twice)."""
    from ds_hetero.optimizer_step import clipping, norm_shares
    from ds_hetero.stages import tied_embeddings

    clipping.is_shared_copy = norm_shares.is_shared_copy = tied_embeddings.is_shared_copy = lambda p: False
    return {}


def run_tied_layouts(rank, world_size, runs):
    """run_layouts for tied models, undoing the controls' patches after each run."""
    from ds_hetero.schedule import pipeline
    from ds_hetero.optimizer_step import clipping, norm_shares
    from ds_hetero.stages import tied_embeddings

    saved = (pipeline.reduce_tied_gradients, tied_embeddings.is_shared_copy)
    out = {}
    for name, kw in runs.items():
        family = kw.get("family", "llava")
        control = {"no_sum": _no_tied_sum, "norm_twice": _norm_counts_both}.get(kw.pop("control", None))
        kw = {"model_kw": TIED, "after": tied_copies(family), **kw}
        if control is not None:
            kw["inspect"] = control
        try:
            out.update(run_layouts(rank, world_size, {name: kw}))
        finally:
            pipeline.reduce_tied_gradients, tied_embeddings.is_shared_copy = saved
            clipping.is_shared_copy = norm_shares.is_shared_copy = saved[1]
    return out


def quick(rank, world_size):
    import os

    which = os.environ.get("TIED_QUICK", "pp2dp2")
    runs = {
        "pp2dp2": dict(layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=1, steps=2),
        "pp2tp2": dict(layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 1, "pp": 2}}, zero_stage=2, steps=2),
    }
    return run_tied_layouts(rank, world_size, {which: runs[which]})


def save_pretrained_tied(rank, world_size, tmp):
    """Tied LLaVA, language pp2 tp2 + vision dp4: train 2 steps, save_pretrained; on rank 0 read it
    back with from_pretrained and compare with every rank's live weights and with the live
    weights' logits (a model loaded with them by load_state_dict)."""
    import copy
    import os

    import torch
    import torch.distributed as dist
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    import ds_hetero
    from ds_hetero.testing.parity import build_model, full_named_parameters, hf_inputs, make_batches

    model = build_model("llava", seed=7, **TIED)
    untrained = copy.deepcopy(model).eval()
    config = {"train_batch_size": 16, "zero_optimization": {"stage": 2}, "gradient_clipping": 0.3,
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
              "hetero_parallel": {"micro_batches": 4, "stages": {"vision": {"dp": 4},
                                                                  "language": {"tp": 2, "dp": 1, "pp": 2}}}}
    engine = ds_hetero.initialize(model, config, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    train, held_out = make_batches("llava", model, 2, 16, seed=40)
    engine.train_batch(train)
    engine.save_pretrained(tmp)
    mine = full_named_parameters(engine)
    parts = [None] * world_size
    dist.all_gather_object(parts, mine)
    reloaded = _per_shard_reload(tmp, config, mine, held_out)
    copies = [None] * world_size
    dist.all_gather_object(copies, reloaded.pop("copy_after_step"))
    out = {}
    if rank == 0:
        live = {k: v for p in parts for k, v in p.items()}
        loaded = AutoModelForImageTextToText.from_pretrained(tmp, dtype=torch.float32).eval()
        params = dict(loaded.named_parameters())
        base = dict(untrained.named_parameters())
        trained = copy.deepcopy(untrained)
        trained.load_state_dict(live, strict=False)
        kw = hf_inputs("llava", untrained, held_out)
        with torch.no_grad():
            logits_diff = (loaded(**kw).logits - trained(**kw).logits).abs().max().item()
        keys = []
        for f in sorted(os.listdir(tmp)):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(tmp, f), "pt") as handle:
                    keys += list(handle.keys())
        out = dict(
            names=sorted(live) == sorted(params) == sorted(base),
            diff=max((params[k].detach() - v).abs().max().item() for k, v in live.items()),
            control=max((base[k].detach() - v).abs().max().item() for k, v in live.items()),
            reloaded_tied=loaded.lm_head.weight is loaded.get_input_embeddings().weight,
            tied_keys=sorted(k for k in keys if "embed_tokens" in k or "lm_head" in k),
            logits_diff=logits_diff, copies_after_reload_step=[c for c in copies if c is not None])
    engine.groups.destroy()
    dist.barrier()
    return {**out, "reload": reloaded}


def _per_shard_reload(tmp, config, live, samples):
    """The saved checkpoint read per shard (`weights=`, from a meta model) into the same layout:
    its weights equal the live ones, the tied copy is the parameter the pipeline stage holds
    after the load, and after one step its copy (gathered over tp) is returned for comparison."""
    import torch

    import ds_hetero
    from ds_hetero.testing.parity import full_named_parameters

    engine = ds_hetero.initialize(ds_hetero.meta_model(tmp), config, weights=tmp,
                                  optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    got = full_named_parameters(engine)
    out = {"weight_diff": max((got[k] - v).abs().max().item() for k, v in live.items()),
           "same_names": sorted(got) == sorted(live)}
    language = engine.stages.language
    copy, chunk = language.tied, language.module
    if copy is not None:
        held = chunk.embed.weight if chunk.is_first else chunk.lm_head.weight
        out["copy_is_held"] = copy.param is held
    engine.train_batch(samples)
    after = full_named_parameters(engine)
    out["copy_after_step"] = None if copy is None else after[TIED_NAME["llava"]].tolist()
    engine.groups.destroy()
    return out


def bf16_tied(rank, world_size, steps=3):
    """Tied LLaVA, language pp2 tp2 + vision dp4, in bf16 with ZeRO 1 (fp32 gradient partitions
    in DeepSpeed's compact buffer) and in fp32 with ZeRO 2, same batches: losses, norms, and this
    rank's copy of the tied weight (None where it holds none)."""
    return bf16_losses(rank, world_size, steps, model_kw=TIED, language={"tp": 2, "dp": 1, "pp": 2},
                       tied_name=TIED_NAME["llava"])
