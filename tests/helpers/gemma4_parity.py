"""Gemma 4 through ds_hetero against the fused model's own `model(**batch).loss` (tests/families/test_families_gemma4.py).

`train_gemma4` runs inside every rank of a 4-rank job, as tests/helpers/family_parity.py's `train_family` does
for the one-encoder families: the same seeded tiny Gemma 4 trained through `ds_hetero.initialize` on the
given layout and as a plain single-process Hugging Face model on the same global batches (same optimizer,
same clipping). `wrong=True` also trains a deliberately wrong reference, the fused model without
`mm_token_type_ids`, which builds plain causal masks (no bidirectional image blocks on the sliding
layers): its weights must end far from the engine's.
"""

import copy
import re

import torch

from ds_hetero.testing.parity import full_named_parameters, max_rel_err
from tests.helpers.gemma4_data import SPECS, gemma4_reference_loss, gemma4_samples


def make_gemma4_batches(model, steps, batch_size, seed=100):
    """Each step a rotation of SPECS (images, clips, both, neither), text lengths varying."""
    return [gemma4_samples(model, (SPECS * 2)[step % 3: step % 3 + batch_size], text_len=5 + step % 3, seed=seed + step)
            for step in range(steps)]


def reference_train(model, batches, make_optimizer, clip, wrong=False):
    from ds_hetero.families import adapter_for

    adapter = adapter_for(model)
    opt = make_optimizer(list(model.parameters()))
    losses, norms = [], []
    for samples in batches:
        loss = gemma4_reference_loss(model, adapter, samples, wrong)
        loss.backward()
        losses.append(float(loss))
        params = [p for p in model.parameters() if p.grad is not None]
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, norms


def train_gemma4(rank, world_size, layout, zero_stage, steps, clip, placement="colocated", micro_batches=2,
                 batch_size=8, wrong=False, model_kw=None, hetero=None, inspect=None):
    """`hetero`: more `hetero_parallel` keys (packed batching); `inspect(engine)` -> more result entries
    (it runs before training, its dict is read after)."""
    import ds_hetero
    from ds_hetero.toy import tiny_gemma4

    def make_optimizer(params):  # eps 1e-4: see tests/engine_parity.py
        return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)

    config = {
        "train_batch_size": batch_size, "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True, "gradient_clipping": clip, "steps_per_print": 10**6,
        "hetero_parallel": {"placement": placement, "micro_batches": micro_batches, "stages": layout,
                            **(hetero or {})},
    }
    model = tiny_gemma4(seed=7, **(model_kw or {}))
    reference = copy.deepcopy(model)
    batches = make_gemma4_batches(model, steps, batch_size)
    engine = ds_hetero.initialize(model, config, optimizer=make_optimizer)
    extra = inspect(engine) if inspect is not None else {}
    results = [engine.train_batch(samples) for samples in batches]
    got = full_named_parameters(engine)
    ref_losses, ref_norms = reference_train(reference, batches, make_optimizer, clip)
    out = {
        "losses": [r.loss for r in results], "ref_losses": ref_losses,
        "norms": [r.grad_norm for r in results], "ref_norms": ref_norms,
        "weight_err": max_rel_err(got, {n: p.detach() for n, p in reference.named_parameters()}),
        "boundary": [(r.boundary_bytes_total, r.boundary_bytes_lower_bound) for r in results],
        "row_bytes": engine.adapter.hidden_size * 4,
        # which parameters this rank holds a tp or ep shard of, layer indices folded
        "sharded": sorted({re.sub(r"\.\d+\.", ".N.", n) for n, p in engine.model.named_parameters()
                           if getattr(p, "tensor_model_parallel", False) or getattr(p, "expert_parallel", False)}),
        **extra,
    }
    if wrong:
        bad = tiny_gemma4(seed=7, **(model_kw or {}))
        bad_losses, _ = reference_train(bad, batches, make_optimizer, clip, wrong=True)
        out["wrong_weights"] = max_rel_err(got, {n: p.detach() for n, p in bad.named_parameters()})
        out["wrong_losses"] = bad_losses
    engine.groups.destroy()
    return out
