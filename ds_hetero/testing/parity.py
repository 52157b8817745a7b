"""Shared by the HeteroEngine parity tests: train N steps with ds_hetero and with one process.

`train_both(...)` runs inside every rank of a 4-rank job: it builds the same seeded model twice,
trains one copy through `ds_hetero.initialize` on the given layout and the other as a plain
single-process Hugging Face model on the same global batches (same optimizer, same clipping),
and returns per-step losses and grad norms of both plus the largest relative weight error.
The reference's loss is also taken from the unmodified Hugging Face model itself
(`model(..., labels=labels).loss`, its own shift and mean over label tokens), so a bug shared by
the project's loss helpers and the reference cannot pass.
"""

import copy

import torch

SCALE_FLOOR = 1e-2
LLAVA_TP4 = dict(text_heads=4, text_kv_heads=4)  # kv heads divisible by tp 4


VIDEO = "video:"  # "video:<family>": a Qwen-VL family on video samples, its model fed the video fields


def build_model(family, seed, **kw):
    from ds_hetero import toy
    from ds_hetero.toy import tiny_llava, tiny_qwen2_5_omni, tiny_qwen2_vl

    if family.startswith(VIDEO):
        return getattr(toy, "tiny_" + family[len(VIDEO):])(seed=seed, **kw)
    if family == "omni":
        return tiny_qwen2_5_omni(seed=seed, **kw)
    if family == "llava":
        return tiny_llava("clip", seed=seed, **kw)
    if family == "siglip":
        return tiny_llava("siglip", seed=seed, **kw)
    return tiny_qwen2_vl(seed=seed, **kw)


def make_batches(family, model, steps, batch_size, seed=100):
    from ds_hetero.testing.batches import llava_samples, qwen_samples

    batches = []
    for step in range(steps):
        if family == "omni":
            samples = omni_batch(model, batch_size, step, seed)
        elif family in ("llava", "siglip"):
            samples = llava_samples(model, batch_size, seed=seed + step)
            # vary text length so micro-batches (and dp shares) carry different label counts
            for i, s in enumerate(samples):
                cut = len(s["input_ids"]) - (1 + 2 * (i >= batch_size // 2)) * ((i + step) % 3)
                samples[i] = {k: (v[:cut] if k in ("input_ids", "labels") else v) for k, v in s.items()}
        else:
            grids = [(1, 4, 4), None, (1, 4, 8), (1, 8, 4), (1, 4, 4), (1, 8, 8), None, (1, 4, 8)]
            grids = (grids * batch_size)[step % 3: step % 3 + batch_size]
            samples = qwen_samples(model, grids, text_len=4 + step % 3, seed=seed + step)
        batches.append(samples)
    return batches


# image only, audio only, both (either order, interleaved), neither; clips of different lengths
OMNI_ITEMS = [
    [("image", (1, 4, 4))], [("audio", 20)], [("audio", 13), ("image", (1, 4, 8)), ("audio", 24)], [],
    [("image", (1, 8, 4)), ("audio", 17)], [("audio", 30)], [("image", (1, 4, 4)), ("image", (1, 4, 4))],
    [("audio", 16), ("image", (1, 4, 4))], [], [("image", (1, 8, 8))],
]


def omni_batch(model, batch_size, step, seed=100):
    from ds_hetero.testing.omni_samples import omni_samples

    items = (OMNI_ITEMS * batch_size)[step % 3: step % 3 + batch_size]
    return omni_samples(model, items, text_len=3 + step % 3, seed=seed + step)


def reference_forward(family, model, adapter, samples):
    if family == "omni":  # the unmodified thinker on the processor's inputs
        from ds_hetero.testing.omni_samples import hf_inputs

        kwargs = hf_inputs(model, adapter, samples)
        out = model(**kwargs)
        return out.logits, kwargs["labels"], float(out.loss)
    if family.startswith(VIDEO):  # the unmodified model on the processor's image and video fields
        from ds_hetero.testing.video_samples import hf_video_inputs

        kwargs = hf_video_inputs(model, adapter, samples)
        out = model(**kwargs)
        return out.logits, kwargs["labels"], float(out.loss.detach())
    batch = adapter.language_inputs(samples)
    vision = adapter.vision_inputs(samples)
    if family in ("llava", "siglip"):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    pixel_values=vision["pixel_values"], labels=batch["labels"])
    else:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    pixel_values=vision["pixel_values"] if len(vision["image_grid_thw"]) else None,
                    image_grid_thw=vision["image_grid_thw"] if len(vision["image_grid_thw"]) else None,
                    mm_token_type_ids=(batch["input_ids"] == model.config.image_token_id).int(),
                    labels=batch["labels"])
    return out.logits, batch["labels"], float(out.loss)  # the model's own loss: mean over label tokens


def hf_inputs(family, model, samples):
    """The padded batch the single-process model takes, labels included."""
    from ds_hetero.families import adapter_for

    adapter = adapter_for(model)
    batch, vision = adapter.language_inputs(samples), adapter.vision_inputs(samples)
    kw = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    if family == "llava":
        kw["pixel_values"] = vision["pixel_values"]
    elif len(vision["image_grid_thw"]):
        kw.update(pixel_values=vision["pixel_values"], image_grid_thw=vision["image_grid_thw"],
                  mm_token_type_ids=(batch["input_ids"] == model.config.image_token_id).int())
    return kw


def reference_train(family, model, batches, make_optimizer, clip, per_stage_clip=False, per_micro_batch_mean=0,
                    step_zero_grads=False):
    """Single-process training; the three flags build deliberately wrong variants (negative controls):
    `step_zero_grads` steps the parameters a batch left without gradient (a text-only batch's
    vision tower) on zero gradients, as DeepSpeed's engines do by themselves."""
    from ds_hetero.loss import label_token_count, token_loss_sum
    from ds_hetero.families import adapter_for

    adapter = adapter_for(model)
    opt = make_optimizer(list(model.parameters()))
    losses, norms, hf_losses = [], [], []
    for samples in batches:
        n = sum(label_token_count(s["labels"]) for s in samples)
        if per_micro_batch_mean:  # wrong: mean per micro-batch, then averaged
            k = len(samples) // per_micro_batch_mean
            total = 0.0
            for j in range(per_micro_batch_mean):
                part = samples[j * k:(j + 1) * k]
                logits, labels, _ = reference_forward(family, model, adapter, part)
                loss = token_loss_sum(logits, labels) / sum(label_token_count(s["labels"]) for s in part)
                (loss / per_micro_batch_mean).backward()
                total += float(loss) / per_micro_batch_mean
            losses.append(total)
        else:
            logits, labels, hf_loss = reference_forward(family, model, adapter, samples)
            hf_losses.append(hf_loss)
            loss = token_loss_sum(logits, labels) / n
            loss.backward()
            losses.append(float(loss))
        if step_zero_grads:
            for p in model.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        params = [p for p in model.parameters() if p.grad is not None]
        if per_stage_clip:  # wrong: each stage clipped by its own norm
            stages = adapter.split()
            total = 0.0
            for module in stages.values():
                ps = [p for p in module.parameters() if p.grad is not None]
                total += float(torch.nn.utils.clip_grad_norm_(ps, clip)) ** 2
            norms.append(total ** 0.5)
        else:
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, norms, hf_losses


def full_named_parameters(engine):
    """The engine's model parameters, unsharded, by Hugging Face name."""
    from ds_hetero.tensor_parallel import gather_full

    import contextlib

    import deepspeed

    out = {}
    for name, p in engine.model.named_parameters():
        if p.is_meta:  # disaggregated: another rank set holds this stage
            continue
        group = getattr(p, "tp_group", None) or _tp_group_of(engine, name)
        # ZeRO-3 keeps each parameter partitioned over its dp group: gather it first
        gathered = deepspeed.zero.GatheredParameters([p]) if hasattr(p, "ds_id") else contextlib.nullcontext()
        with gathered:
            if getattr(p, "expert_parallel", False):  # experts sliced over the ep group on dim 0
                from ds_hetero.expert_parallel.gather import gather_experts

                out[name] = gather_experts(p.detach(), p).cpu()
            elif getattr(p, "tensor_model_parallel", False):
                out[name] = gather_full(p.detach(), p, group).cpu()  # the reference trains on the CPU
            else:
                out[name] = p.detach().cpu().clone()
    return out


def _tp_group_of(engine, name):
    parts = name.split(".")  # Qwen2.5-Omni's towers sit at the top before transformers 5.23 (versions.py)
    stage = "vision" if ("vision_tower" in name or "multi_modal_projector" in name or "visual" in parts) else "language"
    stage = "audio" if "audio_tower" in parts else stage
    return engine.groups[stage].tp


def max_rel_err(got, want):
    """(largest per-tensor relative error max|got - want| / max|want|, where; largest absolute error;
    number of tensors compared: a comparison of nothing must not pass).

    Per tensor, not per entry: entries near zero carry rounding noise that Adam normalises.
    A tensor whose scale is below SCALE_FLOOR is judged against the floor (CLIP's key bias has
    an exactly zero gradient: it starts at 0 and both runs move it by rounding noise alone).
    """
    worst, where, worst_abs, compared = 0.0, None, 0.0, 0
    for name, w in want.items():
        if name not in got:  # a stage this rank does not hold
            continue
        g = got[name]
        assert g.shape == w.shape, (name, g.shape, w.shape)
        if not w.numel():
            continue
        compared += 1
        diff = (g - w).abs().max().item()
        worst_abs = max(worst_abs, diff)
        err = diff / max(w.abs().max().item(), SCALE_FLOOR)
        if err > worst:
            worst, where = err, name
    return worst, where, worst_abs, compared


def train_both(rank, world_size, family, layout, zero_stage, steps, clip, optimizer="adamw", model_kw=None,
               micro_batches=2, batch_size=8, controls=False, placement="colocated", hetero=None,
               make_data=None, inspect=None, prepare=None, freeze_reference=None, after=None, rank_model=None,
               ds_config=None):
    """hetero: more `hetero_parallel` keys; make_data(family, model, steps, batch_size) -> batches
    instead of make_batches; inspect(engine, batches) -> more result entries (may patch the engine
    before training: it runs first and its dict is read after); prepare(model): on the model before
    the reference is copied (e.g. the user's own requires_grad_(False)); freeze_reference(reference):
    freeze in the reference what the config freezes; after(engine, initial, got, results) -> more
    entries, after training (`initial`: the parameters before training, `got`: after, by name);
    rank_model(model, rank): on this rank's model after the reference was copied (e.g. per-rank
    initial weights: the reference stays rank 0's model, which the engine must train); ds_config: more
    DeepSpeed config keys (e.g. a scheduler)."""
    from ds_hetero.entry import initialize

    model_kw = model_kw or {}
    lr = 1e-3 if optimizer == "adamw" else 0.5

    def make_optimizer(params):
        # Adam divides by sqrt(v) + eps. For gradient entries near zero, the fp32 rounding
        # difference of another reduction order (~1e-9) becomes an update difference of about
        # lr * 1e-9 / eps: with eps 1e-8 that is ~1e-4 of some weights, far above rounding.
        # eps 1e-4 keeps Adam's amplification below fp32 rounding; the SGD runs check the
        # gradients themselves, without any such normalisation.
        if optimizer == "adamw":
            return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)
        return torch.optim.SGD(params, lr=lr)

    config = {
        "train_batch_size": batch_size,
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": clip,
        "steps_per_print": 10**6,
        "hetero_parallel": {"placement": placement, "micro_batches": micro_batches, "stages": layout,
                            **(hetero or {})},
        **(ds_config or {}),
    }
    model = build_model(family, seed=7, **model_kw)
    if prepare is not None:
        prepare(model)
    reference = copy.deepcopy(model)
    if freeze_reference is not None:
        freeze_reference(reference)
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()} if after is not None else None
    batches = (make_data or make_batches)(family, model, steps, batch_size)
    if rank_model is not None:
        rank_model(model, rank)

    engine = initialize(model, config, optimizer=make_optimizer)
    extra = inspect(engine, batches) if inspect is not None else {}
    results = [engine.train_batch(samples) for samples in batches]
    got = full_named_parameters(engine)
    if after is not None:
        extra = {**extra, **after(engine, initial, got, results)}

    ref_losses, ref_norms, hf_losses = reference_train(family, reference, batches, make_optimizer, clip)
    want = {n: p.detach() for n, p in reference.named_parameters()}
    weight_err = max_rel_err(got, want)
    out = {
        "losses": [r.loss for r in results], "ref_losses": ref_losses, "hf_losses": hf_losses,
        "norms": [r.grad_norm for r in results], "ref_norms": ref_norms,
        "weight_err": weight_err,
        "compared": weight_err[3],
        "boundary": [(r.boundary_bytes_total, r.boundary_bytes_lower_bound) for r in results],
        "stages_held": sorted(engine.engines),
        "bubble": [r.bubble_fraction for r in results],
        **extra,
    }
    if controls:
        for flag in ("per_stage_clip", "per_micro_batch_mean"):
            wrong = copy.deepcopy(build_model(family, seed=7, **model_kw))
            kwargs = {"per_stage_clip": True} if flag == "per_stage_clip" else {"per_micro_batch_mean": micro_batches}
            losses, _, _ = reference_train(family, wrong, batches, make_optimizer, clip, **kwargs)
            out[flag] = max_rel_err(got, {n: p.detach() for n, p in wrong.named_parameters()})
    engine.groups.destroy()
    return out
