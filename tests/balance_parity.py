"""Token-balanced encoders against the single-process reference, on uneven image tokens.

`train_uneven(...)` runs inside every rank of a 4-rank job: like tests/engine_parity.train_both,
but on tests/uneven_data.py batches, with `hetero_parallel.balance` and per-stage encoder
micro-batches, and it also reports each step's encoder imbalance (max/mean cost over the vision
dp ranks, from the engine's own assignment) under the configured balance and under "position".
"""

import copy
import dataclasses

import torch

from tests.engine_parity import build_model, full_named_parameters, max_rel_err, reference_train
from tests.uneven_data import uneven_batches


def _swap_two_images(inputs):
    """The negative control: two equal-size images of different source ranks trade ranks in the
    boundary inputs only (row counts per rank unchanged, so only the routing is wrong)."""
    runs = [list(inputs.source_runs(i)) for i in range(inputs.num_samples)]
    flat = [(i, k) for i, r in enumerate(runs) for k in range(len(r))]
    for a in flat:
        for b in flat:
            ra, rb = runs[a[0]][a[1]], runs[b[0]][b[1]]
            if ra[0] == rb[0] > 0 and ra[1] != rb[1]:
                runs[a[0]][a[1]], runs[b[0]][b[1]] = (ra[0], rb[1]), (rb[0], ra[1])
                return dataclasses.replace(inputs, src_dp=[tuple(r) if c else d for r, c, d in
                                                           zip(runs, inputs.token_counts, inputs.src_dp)])
    raise AssertionError("no two equal-size images on different ranks to swap")


def train_uneven(rank, world_size, family, layout, zero_stage=1, steps=5, clip=0.3, optimizer="sgd",
                 micro_batches=2, batch_size=8, placement="colocated", balance=None, corrupt=False):
    import ds_hetero
    from ds_hetero.balance import encoder_assignment

    lr = 1e-3 if optimizer == "adamw" else 0.5

    def make_optimizer(params):  # as in tests/engine_parity.py (eps 1e-4: see there)
        if optimizer == "adamw":
            return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)
        return torch.optim.SGD(params, lr=lr)

    section = {"placement": placement, "micro_batches": micro_batches, "stages": layout}
    if balance is not None:
        section["balance"] = balance
    config = {
        "train_batch_size": batch_size, "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True, "gradient_clipping": clip, "steps_per_print": 10**6,
        "hetero_parallel": section,
    }
    model = build_model(family, seed=7)
    reference = copy.deepcopy(model)
    batches = uneven_batches(family, model, steps, batch_size)

    engine = ds_hetero.initialize(model, config, optimizer=make_optimizer)
    if corrupt:
        original = engine.schedule.boundary_inputs
        engine.schedule.boundary_inputs = lambda samples, v: _swap_two_images(original(samples, v))
    results = [engine.train_batch(samples) for samples in batches]
    got = full_named_parameters(engine)

    cfg = engine.config
    position = dataclasses.replace(cfg, balance="position")
    vision_mbs = range(cfg.micro_batches_of("vision"))

    def imbalance(c, what):
        return [max(encoder_assignment(c, engine.adapter, b, "vision", v).imbalance(what) for v in vision_mbs)
                for b in batches]

    ref_losses, ref_norms = reference_train(family, reference, batches, make_optimizer, clip)
    want = {n: p.detach() for n, p in reference.named_parameters()}
    out = {
        "losses": [r.loss for r in results], "ref_losses": ref_losses,
        "norms": [r.grad_norm for r in results], "ref_norms": ref_norms,
        "weight_err": max_rel_err(got, want),
        "boundary": [(r.boundary_bytes_total, r.boundary_bytes_lower_bound) for r in results],
        "imbalance": imbalance(cfg, "cost"), "imbalance_position": imbalance(position, "cost"),
        "split_samples": sum(isinstance(d, tuple) for b in batches for v in vision_mbs
                             for d in engine.schedule.boundary_inputs(b, v).src_dp),
        "compared": len(got),
    }
    engine.groups.destroy()
    return out
