"""Shared by the memory-control tests: the parity check, freezing helpers, and a plain training run.

`check_parity(results)` is the bar of tests/engine_parity.py (losses 1e-5 relative to the
single-process reference and to Hugging Face's own loss, norms 1e-4, every weight tensor 1e-5
relative and 1e-6 absolute, a non-empty comparison). `train_plain` trains one ds_hetero run and
returns its losses and full weights, for runs compared against each other (recompute with
dropout: the single process cannot draw the same dropout masks as a sharded layout).
"""

import torch

RTOL = 1e-5
ATOL = 1e-6
CLIP = 0.3


def check_parity(results, clip=CLIP):
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            assert len(r["losses"]) == len(r["ref_losses"]) == len(r["hf_losses"]) > 0, (rank, name)
            for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
                assert abs(got - want) <= RTOL * abs(want), (rank, name, r["losses"], r["ref_losses"])
                assert abs(want - hf) <= RTOL * abs(hf), (rank, name, r["ref_losses"], r["hf_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
            assert min(r["ref_norms"]) > clip, (name, r["ref_norms"])  # clipping was active
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0, (rank, name, "no weight tensor was compared")
            assert err <= RTOL and abs_err <= ATOL, (rank, name, err, where, abs_err)


def freeze_names(model, prefixes):
    """requires_grad_(False) on every parameter whose name starts with one of `prefixes`."""
    for n, p in model.named_parameters():
        if n.startswith(tuple(prefixes)):
            p.requires_grad_(False)


def frozen_report(prefixes):
    """An `after` hook for train_both: whether every parameter under `prefixes` is bit-identical to
    its initial value, how many there are, and the boundary bytes of the backward exchanges."""

    def after(engine, initial, got, results):
        names = [n for n in got if n.startswith(tuple(prefixes))]
        return {"frozen_compared": len(names),
                "frozen_identical": all(torch.equal(got[n], initial[n]) for n in names),
                "trained_changed": sum(not torch.equal(got[n], initial[n]) for n in got if n not in names),
                "backward_bytes": [r.boundary_bytes_backward for r in results],
                "trains": {s.name: s.trains for s in engine.stages},
                "optimizer_params": {name: sum(p.numel() for g in e.optimizer.param_groups for p in g["params"])
                                     if e.optimizer is not None else 0 for name, e in engine.engines.items()}}

    return after


def set_attention_dropout(model, p):
    """Attention dropout `p` in every attention module (Llama's `attention_dropout`, CLIP's `dropout`)."""
    for m in model.modules():
        for attr in ("attention_dropout", "dropout"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, p)


def train_plain(family, layout, steps, zero_stage=1, micro_batches=2, batch_size=8, model_kw=None, seed=1234,
                prepare=None, hetero=None, dropout=0.0):
    """(losses, full weights by name) of one ds_hetero run with AdamW (eps 1e-4, as engine_parity)."""
    import ds_hetero
    from ds_hetero.testing.parity import build_model, full_named_parameters, make_batches

    model = build_model(family, seed=7, **(model_kw or {}))
    set_attention_dropout(model, dropout)
    batches = make_batches(family, model, steps, batch_size)
    config = {"train_batch_size": batch_size, "zero_optimization": {"stage": zero_stage},
              "zero_allow_untested_optimizer": True, "gradient_clipping": CLIP, "steps_per_print": 10**6,
              "hetero_parallel": {"micro_batches": micro_batches, "stages": layout, **(hetero or {})}}
    engine = ds_hetero.initialize(
        model, config, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.99), eps=1e-4,
                                                             weight_decay=0.01))
    if prepare is not None:
        prepare(engine)
    torch.manual_seed(seed)  # the same dropout stream in every run on this rank
    losses = [engine.train_batch(samples).loss for samples in batches]
    weights = full_named_parameters(engine)
    engine.groups.destroy()
    return losses, weights


def max_diff(a, b):
    """(largest relative loss difference, largest absolute weight difference) between two runs."""
    (la, wa), (lb, wb) = a, b
    loss = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
    weight = max((wa[n] - wb[n]).abs().max().item() for n in wb)
    return loss, weight
