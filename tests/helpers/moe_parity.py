"""Qwen3-VL-MoE and Qwen3.5-MoE with expert parallelism against the single-process Hugging Face model.

`train_moe(rank, world_size, layout, micro_batches, ..., family=...)` trains the same seeded tiny
Qwen3-VL-MoE (or Qwen3.5-MoE: `family="qwen3_5_moe"`) through `ds_hetero.initialize` and as a plain HF model on the same global batches
(fp32, AdamW, clipping active). The reference's loss is the model's own `model(**batch).loss`
(lm loss + router_aux_loss_coef x aux loss, `output_router_logits` on): with one micro-batch on
the global batch; with several, the rule of docs/expert-parallel.md: the lm loss over the global
batch's label tokens, plus the coefficient times the mean over micro-batches of each micro-batch's
own aux loss (`model(**micro_batch)`, its `.aux_loss`).

`control`: a deliberately wrong engine, whose losses or weights must end far from the reference:
"drop" (a capacity of one assignment per expert and source rank: the rest dropped), "wrong_rank"
(each assignment sent to the next ep rank's expert of the same local index), "per_rank_aux"
(each rank's aux loss on its own tokens, averaged), "per_stage_aux" (with pp > 1: each pipeline
stage's aux loss over its own layers only, averaged over the stages, instead of one over all layers).
With pp > 1 every rank holds its pipeline stage's weights: the weights of all ranks are compared.
"""

from __future__ import annotations

import copy

import torch

from ds_hetero.testing.parity import full_named_parameters, max_rel_err
from ds_hetero.testing.batches import qwen_samples
from tests.helpers.family_data import QWEN25_GRIDS, qwen_multi_samples

CLIP = 0.05  # below the norms of every step: clipping is active


def tiny_moe(family="qwen3_vl_moe", seed=7, **kw):
    """The family's tiny MoE model (families/<family>/tiny.py)."""
    from ds_hetero.families.qwen3_5_moe import tiny_qwen3_5_moe
    from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe

    return {"qwen3_vl_moe": tiny_qwen3_vl_moe, "qwen3_5_moe": tiny_qwen3_5_moe}[family](seed=seed, **kw)


def make_batches(model, steps, batch_size, seed=100):
    batches = []
    for step in range(steps):
        grids = (QWEN25_GRIDS * 2)[step % 4: step % 4 + batch_size - 1]
        samples = qwen_samples(model, grids, text_len=4 + step % 3, seed=seed + step)
        samples += qwen_multi_samples(model, [[(1, 8, 8), (1, 4, 4)]], seed=seed + 50 + step)
        batches.append(samples)
    return batches


def hf_forward(model, adapter, samples):
    batch, vision = adapter.language_inputs(samples), adapter.vision_inputs(samples)
    ids = batch["input_ids"]
    has = len(vision["image_grid_thw"]) > 0
    return model(input_ids=ids, attention_mask=batch["attention_mask"], labels=batch["labels"],
                 pixel_values=vision["pixel_values"] if has else None,
                 image_grid_thw=vision["image_grid_thw"] if has else None,
                 mm_token_type_ids=(ids == model.config.image_token_id).int())


def reference_loss(model, adapter, samples, micro_batches):
    """(the model's own loss, its aux loss); with several micro-batches, docs/expert-parallel.md's rule."""
    from ds_hetero.loss import label_token_count

    if micro_batches == 1:
        out = hf_forward(model, adapter, samples)
        return out.loss, float(out.aux_loss)
    coef = model.config.text_config.router_aux_loss_coef
    n = sum(label_token_count(s["labels"]) for s in samples)
    k = len(samples) // micro_batches
    total, aux = 0.0, 0.0
    for m in range(micro_batches):
        part = samples[m * k:(m + 1) * k]
        out = hf_forward(model, adapter, part)
        lm_mean = out.loss - coef * out.aux_loss  # the model's lm loss on the micro-batch
        total = total + lm_mean * sum(label_token_count(s["labels"]) for s in part) / n \
            + coef * out.aux_loss / micro_batches
        aux += float(out.aux_loss) / micro_batches
    return total, aux


def reference_train(model, batches, make_optimizer, clip, micro_batches):
    from ds_hetero.families import adapter_for

    adapter = adapter_for(model.get_base_model() if hasattr(model, "get_base_model") else model)  # a PeftModel's base
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad])
    losses, norms, auxes = [], [], []
    for samples in batches:
        loss, aux = reference_loss(model, adapter, samples, micro_batches)
        loss.backward()
        losses.append(float(loss))
        auxes.append(aux)
        norms.append(float(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], clip)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, norms, auxes


def _drop_router(capacity):
    from ds_hetero.expert_parallel.dispatch import Routes, route

    def router(top_k_index, num_experts):
        r = route(top_k_index, num_experts)
        expert = top_k_index.reshape(-1)[r.order]
        first = torch.searchsorted(expert, expert, right=False)  # position inside its expert's run
        keep = (torch.arange(expert.numel()) - first) < capacity
        order = r.order[keep]
        return Routes(order=order, token=order // top_k_index.shape[-1],
                      counts=torch.bincount(expert[keep], minlength=num_experts))
    return router


def _wrong_rank_router(per_rank):
    from ds_hetero.expert_parallel.dispatch import route

    def router(top_k_index, num_experts):
        return route((top_k_index + per_rank) % num_experts, num_experts)  # the next rank's expert
    return router


def apply_control(engine, control):
    from ds_hetero.expert_parallel import ExpertParallelExperts

    module = engine.stages.language.module
    if control in ("per_rank_aux", "per_stage_aux"):
        module.aux_rule = control[:-4]
        return
    for m in module.modules():
        if isinstance(m, ExpertParallelExperts):
            m.router = _drop_router(1) if control == "drop" else _wrong_rank_router(m.num_local_experts)


def _expert_partition(engine):
    """(ranks an expert weight is partitioned over, its elements, this rank's) under ZeRO 3; None otherwise."""
    import torch.distributed as dist

    from ds_hetero.expert_parallel import is_expert_parameter

    p = next((p for p in engine.stages.language.module.parameters() if is_expert_parameter(p)), None)
    if p is None or not hasattr(p, "ds_tensor"):
        return None
    return dist.get_world_size(p.ds_process_group), int(p.ds_numel), int(p.ds_tensor.numel())


def train_moe(rank, world_size, layout, micro_batches=1, steps=5, batch_size=8, control=None, model_kw=None,
              zero_stage=0, hetero=None, reference_micro_batches=None, evaluate=False, family="qwen3_vl_moe",
              inspect=None):
    """`reference_micro_batches`: the reference's aux-loss rule computed for another micro-batch
    count (a negative control of the several-micro-batch rule). `evaluate`: also `eval_batch` of
    the first batch after training, against the trained reference's loss on it by the same rule.
    `inspect(engine)` -> more result entries (it runs before training, its dict is read after)."""
    import ds_hetero

    def make_optimizer(params):  # eps 1e-4: see ds_hetero/testing/parity.py
        return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)

    model = tiny_moe(family, seed=7, **(model_kw or {}))
    reference = copy.deepcopy(model)
    freeze = layout["language"].get("freeze") or ()
    if freeze:  # the reference freezes what the config freezes (fnmatch patterns of HF names)
        import fnmatch

        for n, p in reference.named_parameters():
            if any(fnmatch.fnmatch(n, pat) for pat in freeze):
                p.requires_grad_(False)
    batches = make_batches(model, steps, batch_size)
    config = {
        "train_batch_size": batch_size, "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True, "gradient_clipping": CLIP, "steps_per_print": 10**6,
        "hetero_parallel": {"placement": "colocated", "micro_batches": micro_batches, "stages": layout,
                            **(hetero or {})},
    }
    engine = ds_hetero.initialize(model, config, optimizer=make_optimizer)
    if control is not None:
        apply_control(engine, control)
    extra = inspect(engine) if inspect is not None else {}
    results = [engine.train_batch(samples) for samples in batches]
    partition = _expert_partition(engine)
    # what this rank's language stage holds (tp shards, E / ep experts), as the planner counts it
    local = sum(p.numel() for p in engine.stages.language.module.parameters()) if zero_stage < 3 else None
    got = full_named_parameters(engine)
    parts = _every_rank(got, world_size) if layout["language"].get("pp", 1) > 1 else [got]
    evaluated = engine.eval_batch(batches[0]) if evaluate else None
    ref_losses, ref_norms, ref_aux = reference_train(reference, batches, make_optimizer, CLIP,
                                                     reference_micro_batches or micro_batches)
    out = {
        "losses": [r.loss for r in results], "ref_losses": ref_losses,
        "aux": [r.aux_loss for r in results], "ref_aux": ref_aux,
        "norms": [r.grad_norm for r in results], "ref_norms": ref_norms,
        "weight_err": _worst(parts, {n: p.detach() for n, p in reference.named_parameters()}),
        "n_params": len(dict(reference.named_parameters())),
        "expert_partition": partition, "language_params": local,
        **extra,
    }
    if evaluate:
        from ds_hetero.families import adapter_for

        with torch.no_grad():
            want, _ = reference_loss(reference, adapter_for(reference), batches[0], micro_batches)
        out["eval"] = (evaluated, float(want))
    engine.groups.destroy()
    return out


def _every_rank(got, world_size):
    """Every rank's weights (a pipeline: each holds its own pipeline stage's)."""
    import torch.distributed as dist

    parts = [None] * world_size
    dist.all_gather_object(parts, got)
    return parts


def _worst(parts, want):
    """max_rel_err's worst over every rank's weights; compared: the distinct weights compared."""
    errs = [max_rel_err(part, want) for part in parts]
    err, where, _, _ = max(errs, key=lambda e: e[0])
    return err, where, max(e[2] for e in errs), len(set().union(*parts) & set(want))


def dispatch_adjoint(rank, world_size, ep=4, tokens=13, hidden=6, experts=8, top_k=2):
    """sum over ranks <A x, y> and <x, A^T y> for dispatch (x -> the rows each rank's experts get)
    and combine (expert outputs -> weighted token sums), A^T by autograd; over the world as the ep group."""
    import torch.distributed as dist

    from ds_hetero.expert_parallel.dispatch import combine, dispatch
    from ds_hetero.topology.distributed import ensure_distributed

    ensure_distributed(300.0)  # deepspeed.comm too: AutoEP's exchange calls through it
    group = dist.new_group(list(range(world_size)))
    gen = torch.Generator().manual_seed(10 + rank)
    x = torch.randn(tokens + rank, hidden, generator=gen, dtype=torch.float64, requires_grad=True)
    index = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(x.shape[0])])
    weights = torch.rand(x.shape[0], top_k, generator=gen, dtype=torch.float64)
    rows, d = dispatch(x, index, experts, group, ep)
    y = torch.randn(rows.shape, generator=gen, dtype=torch.float64)
    (rows * y).sum().backward()
    sums = torch.tensor([float((rows * y).sum()), float((x * x.grad).sum())], dtype=torch.float64)
    # combine: linear in the expert outputs z
    z = torch.randn(rows.shape, generator=gen, dtype=torch.float64, requires_grad=True)
    out = combine(z, d, weights, group)
    w = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    (out * w).sum().backward()
    sums = torch.cat([sums, torch.tensor([float((out * w).sum()), float((z * z.grad).sum())], dtype=torch.float64)])
    # every assignment arrives exactly once, at the rank of its expert, as that expert's local index
    mine = [e for e in index.reshape(-1).tolist()]
    arrived = torch.tensor([rows.shape[0]], dtype=torch.long)
    counts = torch.bincount(index.reshape(-1), minlength=experts)
    dist.all_reduce(sums, group=group)
    dist.all_reduce(counts, group=group)
    local = experts // ep
    expect = int(counts[rank * local:(rank + 1) * local].sum())
    dist.destroy_process_group(group)
    return {"dispatch": (sums[0].item(), sums[1].item()), "combine": (sums[2].item(), sums[3].item()),
            "arrived": int(arrived), "expected": expect, "assignments": len(mine)}


def save_and_load(rank, world_size, tmp, layout, family="qwen3_vl_moe"):
    """save_pretrained from an ep layout, then load that checkpoint per shard into another layout:
    the exported weights are the engine's, and the loaded engine's first loss equals the first's."""
    import torch.distributed as dist

    import ds_hetero

    def config(lay):
        return {"train_batch_size": 8, "zero_optimization": {"stage": 0}, "gradient_clipping": CLIP,
                "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_allow_untested_optimizer": True,
                "steps_per_print": 10**6, "hetero_parallel": {"placement": "colocated", "micro_batches": 1,
                                                             "stages": lay}}

    model = tiny_moe(family, seed=3)
    batches = make_batches(model, 2, 8)
    engine = ds_hetero.initialize(model, config(layout))
    engine.train_batch(batches[0])
    got = full_named_parameters(engine)
    engine.save_pretrained(tmp)
    dist.barrier()
    after = engine.eval_batch(batches[1])  # eval: the lm loss and the aux loss of the trained weights
    engine.groups.destroy()
    saved = type(model).from_pretrained(tmp)
    export_err = max_rel_err(got, dict(saved.named_parameters()))
    other = {"vision": {"dp": 4}, "language": {"tp": 1, "dp": 4, "ep": 4}}
    loaded = ds_hetero.initialize(ds_hetero.meta_model(tmp, dtype=torch.float32), config(other), weights=tmp)
    language = loaded.load_report["language"]  # ep4, tp1: the experts are the only sharded tensors
    reloaded = loaded.eval_batch(batches[1])
    loaded.groups.destroy()
    return {"export_err": export_err, "eval": (after, reloaded),
            "experts_read": (language.sharded_bytes_read, language.sharded_bytes_full)}
