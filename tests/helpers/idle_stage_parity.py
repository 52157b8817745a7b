"""Shared by the idle-stage tests: Qwen2-VL trained on batches of which some have no image at all
(the vision stage has no work in those steps), against the single-process Hugging Face run."""

from ds_hetero.testing.parity import build_model, make_batches, max_rel_err, reference_train

TEXT_ONLY = (1,)  # steps whose global batch has no image
STEPS = 4
# a constant learning rate through DeepSpeed's scheduler: the engines' schedulers must advance
# in a text-only step as in any other (the reference's lr is the same constant)
SCHEDULER = {"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-3,
                                                         "warmup_num_steps": 1, "warmup_type": "linear"}}}


def batches_with_text_only_steps(family, model, steps, batch_size):
    from ds_hetero.testing.batches import qwen_samples

    batches = make_batches(family, model, steps, batch_size)
    for s in TEXT_ONLY:
        batches[s] = qwen_samples(model, [None] * batch_size, text_len=5 + s, seed=300 + s)
    return batches


def idle_per_step(engine, batches):
    """`inspect` hook: the stages the plan leaves without work in each step, and whether the
    stages share one engine (read before training)."""
    from ds_hetero.step.step_plan import StepPlan

    plans = [StepPlan(engine.config, engine.adapter.encoders(), samples) for samples in batches]
    return {"idle": [sorted(p.idle_encoders()) for p in plans],
            "shared": sorted(s.name for s in engine.stages.held if s.engine_owner is not None)}


def counters_and_control(engine, initial, got, results):
    """`after` hook: every engine's step counters, and the distance of the trained weights from a
    single-process run that steps zero gradients on the vision tower in text-only steps (the
    negative control: the engine must be far from it)."""
    counters = {name: (e.global_steps, e.skipped_steps,
                       e.lr_scheduler.last_batch_iteration if e.lr_scheduler is not None else None)
                for name, e in engine.engines.items()}
    model = build_model("qwen2_vl", seed=7)
    batches = batches_with_text_only_steps("qwen2_vl", model, STEPS, 8)
    zero_stepped = reference_train("qwen2_vl", model, batches, _adamw, 0.3, step_zero_grads=True)
    control = max_rel_err(got, {n: p.detach() for n, p in model.named_parameters()})
    return {"counters": counters, "skipped": [r.skipped for r in results],
            "control_err": control[0], "control_losses": zero_stepped[0]}


def _adamw(params):
    import torch

    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)


def checkpoint_chain(rank, tmp):
    """A checkpoint saved after a text-only step carries each stage's own optimizer step count into
    another layout: shared ZeRO 0 trains steps 0-1 and saves; separate engines at ZeRO 1 load it,
    train step 2 and save; shared ZeRO 1 loads that and trains step 3. The weights after step 3
    against the single-process run of all four."""
    import os

    import ds_hetero
    from ds_hetero.testing.parity import full_named_parameters

    model = build_model("qwen2_vl", seed=7)
    batches = batches_with_text_only_steps("qwen2_vl", model, STEPS, 8)
    reference = build_model("qwen2_vl", seed=7)
    reference_train("qwen2_vl", reference, batches, _adamw, 0.3)

    def engine_for(layout, zero, seed):
        config = {"train_batch_size": 8, "zero_optimization": {"stage": zero}, "zero_allow_untested_optimizer": True,
                  "gradient_clipping": 0.3, "steps_per_print": 10**6, **SCHEDULER,
                  "hetero_parallel": {"micro_batches": 2, "stages": layout}}
        return ds_hetero.initialize(build_model("qwen2_vl", seed=seed), config, optimizer=_adamw)

    shared = {"vision": {"dp": 2}, "language": {"dp": 2}}
    separate = {"vision": {"dp": 2}, "language": {"tp": 2, "dp": 1}}
    out = {"owners": []}
    engine = engine_for(shared, 0, 7)
    losses = [engine.train_batch(s).loss for s in batches[:2]]
    out["owners"].append(sorted(s.name for s in engine.stages.held if s.engine_owner is not None))
    engine.save_checkpoint(os.path.join(tmp, "ckpt_shared_zero0"))
    engine.groups.destroy()
    engine = engine_for(separate, 1, 99)  # other initial weights: the checkpoint must replace them
    engine.load_checkpoint(os.path.join(tmp, "ckpt_shared_zero0"))
    out["owners"].append(sorted(s.name for s in engine.stages.held if s.engine_owner is not None))
    losses.append(engine.train_batch(batches[2]).loss)
    engine.save_checkpoint(os.path.join(tmp, "ckpt_separate_zero1"))
    engine.groups.destroy()
    engine = engine_for(shared, 1, 99)
    engine.load_checkpoint(os.path.join(tmp, "ckpt_separate_zero1"))
    out["owners"].append(sorted(s.name for s in engine.stages.held if s.engine_owner is not None))
    losses.append(engine.train_batch(batches[3]).loss)
    got = full_named_parameters(engine)
    engine.groups.destroy()
    out["losses"] = losses
    out["weight_err"] = max_rel_err(got, {n: p.detach() for n, p in reference.named_parameters()})
    return out
