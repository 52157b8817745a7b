"""Token-balanced encoders against the single-process reference, on uneven image tokens.

`train_uneven(...)` is ds_hetero.testing.parity.train_both on ds_hetero/testing/uneven.py batches, with
`hetero_parallel.balance` and per-stage encoder micro-batches (in `layout`), reporting also
each step's encoder imbalance (max/mean cost over the vision dp ranks, from the engine's own
assignment) under the configured balance and under "position", and how many samples had their
images encoded on several ranks. `corrupt=True` is the negative control.
"""

import dataclasses

from ds_hetero.testing.parity import train_both
from ds_hetero.testing.uneven import uneven_batches


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


def _balance_figures(family, corrupt):
    def inspect(engine, batches):
        from ds_hetero.step.balance import encoder_assignment
        from ds_hetero.families import adapter_for
        from ds_hetero.testing.parity import build_model, reference_forward

        from ds_hetero.step.step_plan import StepPlan

        cfg = engine.config
        vision_mbs = range(cfg.micro_batches_of("vision"))

        def imbalance(c):
            return [max(encoder_assignment(c, engine.adapter, b, "vision", v).imbalance() for v in vision_mbs)
                    for b in batches]

        # eval_batch (before training) on an uneven batch: the untrained HF model's own loss
        model = build_model(family, seed=7)
        out = {
            "eval": (engine.eval_batch(batches[0]), reference_forward(family, model, adapter_for(model), batches[0])[2]),
            "imbalance": imbalance(cfg), "imbalance_position": imbalance(dataclasses.replace(cfg, balance="position")),
            "split_samples": sum(isinstance(d, tuple) for b in batches for v in vision_mbs
                                 for d in StepPlan(cfg, engine.adapter.encoders(), b).encoder_pass("vision", v)
                                 .boundary.src_dp),
        }
        if corrupt:  # every plan built until train_uneven returns routes two images to the wrong rows
            original = StepPlan._encoder_pass
            StepPlan._encoder_pass = lambda self, *a: dataclasses.replace(
                original(self, *a), boundary=_swap_two_images(original(self, *a).boundary))
        return out
    return inspect


def train_uneven(rank, world_size, family, layout, zero_stage=1, steps=5, clip=0.3, optimizer="sgd",
                 micro_batches=2, placement="colocated", balance=None, corrupt=False):
    from ds_hetero.step.step_plan import StepPlan

    right = StepPlan._encoder_pass
    try:
        return train_both(rank, world_size, family, layout, zero_stage, steps, clip, optimizer=optimizer,
                          micro_batches=micro_batches, placement=placement,
                          hetero={"balance": balance} if balance else None, make_data=uneven_batches,
                          inspect=_balance_figures(family, corrupt))
    finally:  # undo the control's patch: later runs in the same process (a shared launch) plan right
        StepPlan._encoder_pass = right
