"""Packed language micro-batches with the per-stage features: recompute, freeze, PEFT LoRA, tied
embeddings (with and without pp) and the `mixed` placement (tests/engine/test_packing_features.py).

`train_packed_with(...)` is ds_hetero.testing.parity.train_both with `language_batching` "packed"
(LLaVA and Qwen2-VL on ds_hetero/testing/uneven.py batches; the omni model on its own mixed
image/audio/text-only batches), and reports, as tests/helpers/packing_parity.py does, how many
samples shared a packed row (packing must have happened) and eval_batch against the untrained
Hugging Face model's own loss on the unpacked batch.
"""

from ds_hetero.testing.parity import build_model, reference_forward, train_both
from ds_hetero.testing.uneven import uneven_batches


def _figures(family, model_kw, prepare):
    def inspect(engine, batches):
        from ds_hetero.families import adapter_for
        from ds_hetero.models.per_sample_attention import calls_per_sample
        from ds_hetero.step.step_plan import StepPlan

        dp = engine.config.language.dp
        shared = []
        for b in batches:
            plan = StepPlan(engine.config, engine.adapter.encoders(), b, language_cost=engine.adapter.language_cost,
                            dense_attention=engine.adapter.dense_rows(engine.config.packed_attention))  # the engine's
            shared.append(max(len(row) for d in range(dp) for m in range(plan.micro_batches)
                              for row in plan.language_rows(d, m)))
        model = build_model(family, seed=7, **model_kw)  # the untrained model, as the engine's before step 1
        if prepare is not None:
            prepare(model)
        want = reference_forward(family, model, adapter_for(model), batches[0])[2]
        # which held stages checkpoint some layer (models/recompute.py sets the flag per layer)
        recomputed = {s.name: any(getattr(m, "gradient_checkpointing", False) is True for m in s.module.modules())
                      for s in engine.stages.held}
        language = engine.stages.language  # its attention modules call the per-sample entry (sdpa, the default)
        per_sample = sum(map(calls_per_sample, language.module.modules())) if language.held else None
        return {"most_in_a_row": shared, "eval": (engine.eval_batch(batches[0]), want), "recomputed": recomputed,
                "per_sample_modules": per_sample}

    return inspect


def train_packed_with(rank, world_size, family, layout, zero_stage=1, steps=5, clip=0.3, optimizer="sgd",
                      micro_batches=2, placement="colocated", model_kw=None, lora=False, frozen=None,
                      control=None):
    """frozen: the parameter-name prefixes the config freezes (frozen in the reference too, and
    checked bit-identical); lora: PEFT adapters injected before the reference is copied; tied
    models report each rank's copy of the tied weight (tests/helpers/tied_pipeline_parity.py);
    control: a deliberately wrong run (CONTROLS), which must miss the bar."""
    from tests.helpers.equal_replicas import add_lora
    from tests.helpers.memory_parity import freeze_names, frozen_report

    model_kw = model_kw or {}
    prepare = add_lora if lora else None
    freeze_reference = (lambda m: freeze_names(m, frozen)) if frozen else None
    after = frozen_report(frozen) if frozen else _tie_report(family) if model_kw.get("tie_word_embeddings") else None
    restore = CONTROLS[control]() if control else (lambda: None)
    try:
        return _train(rank, world_size, family, layout, zero_stage, steps, clip, optimizer, micro_batches,
                      placement, model_kw, prepare, freeze_reference, after)
    finally:  # later cases in the same launch run right
        restore()


def _tie_report(family):
    """`after` hook: the pipeline's copy of the tied weight (tests/helpers/tied_pipeline_parity.py)
    and, without pp, whether the language engine's head and embedding are still one parameter."""
    from tests.helpers.tied_pipeline_parity import tied_copies

    copies = tied_copies(family)

    def after(engine, initial, got, results):
        out = copies(engine, initial, got, results)
        lang = engine.engines.get("language")
        if lang is not None and engine.stages.language.tied is None:
            stage = lang.module
            out["one_parameter"] = stage.lm_head.weight is stage.language_model.get_input_embeddings().weight
        return out

    return after


def _no_tied_sum():
    from ds_hetero.schedule import pipeline

    right = pipeline.reduce_tied_gradients
    pipeline.reduce_tied_gradients = lambda stage: None
    return lambda: setattr(pipeline, "reduce_tied_gradients", right)


def _positions_not_restarted():
    from tests.helpers.packing_parity import _wrong_packing

    return _wrong_packing("positions not restarted")


# the tied copies' gradients not summed over the embedding group (pp); packed positions running on
# across samples, so attention and RoPE cross sample boundaries
CONTROLS = {"tied copies not summed": _no_tied_sum, "positions not restarted": _positions_not_restarted}


def _train(rank, world_size, family, layout, zero_stage, steps, clip, optimizer, micro_batches, placement,
           model_kw, prepare, freeze_reference, after):
    return train_both(rank, world_size, family, layout, zero_stage, steps, clip, optimizer=optimizer,
                      micro_batches=micro_batches, placement=placement, model_kw=model_kw,
                      hetero={"language_batching": "packed"},
                      make_data=None if family == "omni" else uneven_batches,
                      inspect=_figures(family, model_kw, prepare), prepare=prepare,
                      freeze_reference=freeze_reference, after=after)


def measured(results):
    """The worst relative loss, norm and weight errors of one case over every rank."""
    loss = max(abs(a - b) / abs(b) for r in results for a, b in zip(r["losses"], r["ref_losses"]))
    norm = max(abs(a - b) / abs(b) for r in results for a, b in zip(r["norms"], r["ref_norms"]))
    weight = max(r["weight_err"][0] for r in results)
    return {"loss": loss, "norm": norm, "weight": weight}


def lora_dropout_recompute(rank, world_size, steps=3):
    """PEFT LoRA with dropout 0.1 (drawn from the stage's model-parallel streams under tp), packed,
    vision dp4 + language tp2dp2: losses and norms with `recompute: true` on both stages, without,
    and with dropout 0 (the dropout did act). No single-process reference can draw the masks of a
    packed, sharded row; the recompute must replay exactly the masks of the forward."""
    import ds_hetero
    from ds_hetero.testing.uneven import uneven_batches
    from tests.helpers.lora_dropout_checks import _optimizer, lora_llava

    out = {}
    for name, dropout, recompute in (("recompute", 0.1, True), ("plain", 0.1, False), ("no dropout", 0.0, False)):
        peft = lora_llava(dropout)
        batches = uneven_batches("llava", peft.get_base_model(), steps, 8)
        stages = {"vision": {"dp": 4, "recompute": recompute}, "language": {"tp": 2, "dp": 2, "recompute": recompute}}
        config = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
                  "gradient_clipping": 0.3, "steps_per_print": 10**6,
                  "hetero_parallel": {"micro_batches": 2, "language_batching": "packed", "stages": stages}}
        engine = ds_hetero.initialize(peft, config, optimizer=_optimizer)
        results = [engine.train_batch(b) for b in batches]
        out[name] = {"losses": [r.loss for r in results], "norms": [r.grad_norm for r in results]}
        engine.groups.destroy()
    return out
