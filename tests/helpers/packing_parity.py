"""Packed language micro-batches against the single-process reference on the UNPACKED batch.

`train_packed(...)` is ds_hetero.testing.parity.train_both with `language_batching` "packed" on
ds_hetero/testing/uneven.py batches (samples of very different lengths, text-only samples whose
first token carries a label, several images per sample); it also reports, per step, how many
samples shared a packed row on this rank's plan (packing must have happened), the packed
plan's real/computed tokens, and how many ranks' rows hold their samples out of batch order (a
dense kernel's balanced rows, step/rows.py). `control` runs a deliberately wrong packing (negative controls):

    "positions not restarted"   every row's positions count 0..L-1 across its samples (the
                                mRoPE families: the text plane too) and the per-sample attention
                                takes the row as one segment, so attention and RoPE cross sample
                                boundaries
    "loss across samples"       the first label of each sample is kept, so the last token of a
                                sample predicts the first token of the next
"""

import torch

from ds_hetero.testing.parity import train_both
from ds_hetero.testing.uneven import uneven_batches


def _wrong_packing(kind):
    from ds_hetero.models import packing
    from ds_hetero.schedule import stage_work

    right = stage_work.packed_language_inputs

    def wrong(adapter, rows, multiple=1):
        out = right(adapter, rows, multiple)
        if kind == "positions not restarted":
            p = out["position_ids"]
            length = p.shape[-1]
            out["position_ids"] = torch.arange(length).expand_as(p).contiguous()
            out["sequence_ids"] = torch.zeros_like(out["sequence_ids"])
            out["packed_segments"] = tuple((length,) for _ in rows)
        else:  # restore every sample's own first label
            labels = out["labels"]
            for r, row in enumerate(rows):
                offset = 0
                for s in row:
                    labels[r, offset] = s["labels"].reshape(-1)[0]
                    offset += int(s["input_ids"].numel())
        return out

    assert packing.packed_language_inputs is right
    stage_work.packed_language_inputs = wrong
    return lambda: setattr(stage_work, "packed_language_inputs", right)


def _packing_figures(engine, batches):
    from ds_hetero.families import adapter_for
    from ds_hetero.models.per_sample_attention import calls_per_sample
    from ds_hetero.step.step_plan import StepPlan
    from ds_hetero.testing.parity import build_model, reference_forward

    language = engine.stages.language
    shared, computed, real, moved, reordered = [], 0, 0, 0, 0
    for b in batches:
        plan = StepPlan(engine.config, engine.adapter.encoders(), b, language_cost=engine.adapter.language_cost,
                        dense_attention=engine.adapter.dense_rows(engine.config.packed_attention))  # the engine's
        dp = engine.config.language.dp
        shared.append(max(len(row) for d in range(dp) for m in range(plan.micro_batches)
                          for row in plan.language_rows(d, m)))
        # samples out of the samples cut's micro-batch, and every encoder pass on its feeds' union
        moved += sum(p // plan.micro_batch_size != m for m in range(plan.micro_batches)
                     for p in plan.micro_batch_samples(m))
        for passes in plan.passes.values():
            assert all(list(p_.samples) == [q for m in p_.feeds for q in plan.micro_batch_samples(m)]
                       for p_ in passes)
        for m in range(plan.micro_batches):
            for d in range(dp):
                rows = plan.language_rows(d, m)
                flat = [p for row in rows for p in row]
                reordered += flat != sorted(flat)  # a dense kernel's balanced rows: not in batch order
                longest = max(sum(int(b[p]["input_ids"].numel()) for p in row) for row in rows)
                computed += longest * len(rows)
                real += sum(int(b[p]["input_ids"].numel()) for row in rows for p in row)
    # eval_batch (before training, packed as training packs) against the untrained HF model's own loss
    family = "llava" if type(engine.model).__name__.startswith("Llava") else "qwen2_vl"
    model = build_model(family, seed=7)
    evaluated = (engine.eval_batch(batches[0]), reference_forward(family, model, adapter_for(model), batches[0])[2])
    return {"most_in_a_row": shared, "real_computed": real / computed, "held": language.held, "eval": evaluated,
            "moved": moved, "reordered": reordered,
            "mode": engine.adapter.packed_attention(engine.config.packed_attention),
            "per_sample_modules": sum(map(calls_per_sample, language.module.modules())) if language.held else None}


def longest_first(family, model, steps, batch_size):
    """uneven_batches with each batch's longest sample first and the rest shortest first: the
    samples cut's first micro-batch is one long sample among the shortest, more than a rank's
    share of it, so balancing needs samples from the other micro-batches."""
    out = []
    for b in uneven_batches(family, model, steps, batch_size):
        b = sorted(b, key=lambda s: int(s["input_ids"].numel()))
        out.append([b[-1]] + b[:-1])
    return out


def with_an_empty_sample(family, model, steps, batch_size):
    """uneven_batches with sample 3 of every batch empty (no token, no label): one process pads it to a
    row of padding that adds nothing; packing gives it no position (issue 49: it once broke the step on
    the ranks whose share held it)."""
    out = uneven_batches(family, model, steps, batch_size)
    for batch in out:
        batch[3] = {"input_ids": torch.zeros(0, dtype=torch.long), "labels": torch.zeros(0, dtype=torch.long)}
    return out


def train_packed(rank, world_size, family, layout, zero_stage=1, steps=5, clip=0.3, optimizer="sgd",
                 micro_batches=2, placement="colocated", control=None, hetero=None, batch_size=8, skewed=False,
                 empty_sample=False):
    """`skewed`: `longest_first` batches (every long sample in the samples cut's first micro-batch);
    `empty_sample`: `with_an_empty_sample` batches."""
    restore = _wrong_packing(control) if control else (lambda: None)
    make_data = longest_first if skewed else with_an_empty_sample if empty_sample else uneven_batches
    try:
        return train_both(rank, world_size, family, layout, zero_stage, steps, clip, optimizer=optimizer,
                          micro_batches=micro_batches, placement=placement, batch_size=batch_size,
                          hetero={"language_batching": "packed", **(hetero or {})},
                          make_data=make_data, inspect=_packing_figures)
    finally:  # later cases in the same launch pack right
        restore()


def loader_pair(rank, world_size, layout, steps=3):
    """The engine's own loader (each rank reads in full only its shares, light samples elsewhere):
    packed against the samples cut on the same seeded dataset: the same losses and norms (the same
    function), and the packed run read its packed language shares (known only from the token ids)."""
    import ds_hetero
    from ds_hetero.toy import tiny_llava
    from ds_hetero.toy import ShapesCaptionDataset

    out = {}
    for batching in ("samples", "packed"):
        model = tiny_llava("clip", seed=3)
        data = ShapesCaptionDataset.for_llava(model.config, size=32, seed=0)
        config = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "gradient_clipping": 0.3,
                  "optimizer": {"type": "SGD", "params": {"lr": 0.5}}, "zero_allow_untested_optimizer": True,
                  "steps_per_print": 10**6,
                  "hetero_parallel": {"micro_batches": 2, "language_batching": batching, "stages": layout}}
        engine = ds_hetero.initialize(model, config, training_data=data)
        results = [engine.train_batch() for _ in range(steps)]
        out[batching] = {"losses": [r.loss for r in results], "norms": [r.grad_norm for r in results],
                         "load": [r.language_tokens for r in results]}
        engine.groups.destroy()
    return out
