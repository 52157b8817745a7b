"""A step whose all-stage gradient norm is not finite is skipped by every stage engine of every rank.

For every ZeRO stage (0 included), bf16 included, in both placements: after a step with NaN in
`pixel_values` (every stage's gradients are NaN) and after a step where only the vision stage's
gradients are NaN (the language stage's own gradients are finite: it must still skip),

- every weight, fp32 master partition and optimizer state tensor is bit-identical to before,
- `StepResult.skipped` is True on every rank, and every engine counted the skip the way
  DeepSpeed counts an overflow (`skipped_steps` + 1, `global_steps` + 1, lr scheduler held),
- the next good batch trains normally (finite loss, not skipped, the weights move).

One 2-rank launch runs all layouts. The negative control is the bug this test was written
against: before the fix, ZeRO 0 applied the NaN step (the weights changed, later losses NaN).
"""

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

RUNS = {
    "colocated zero0 fp32": dict(zero=0, placement="colocated"),
    "colocated zero1 bf16": dict(zero=1, bf16=True, placement="colocated"),
    "colocated zero3 fp32": dict(zero=3, placement="colocated"),
    "disaggregated zero0 fp32": dict(zero=0, placement="disaggregated"),
    "disaggregated zero2 bf16": dict(zero=2, bf16=True, placement="disaggregated"),
}


def _config(zero, placement, bf16=False):
    stages = ({"vision": {"dp": 2}, "language": {"dp": 2}} if placement == "colocated"
              else {"vision": {"dp": 1}, "language": {"dp": 1}})
    cfg = {
        "train_batch_size": 4, "zero_optimization": {"stage": zero}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3,
                                                     "warmup_num_steps": 10}},
        "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
        "hetero_parallel": {"placement": placement, "micro_batches": 2, "stages": stages},
    }
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def _state(engine):
    """Every tensor a step may change: module weights (this rank's partition), the optimizer's
    own parameters (fp32 master partitions under ZeRO) and its state (Adam moments)."""
    import torch

    opt = engine.optimizer
    base = getattr(opt, "optimizer", opt)  # DeepSpeed's ZeRO wrappers hold the torch optimizer
    tensors = [getattr(p, "ds_tensor", p) for p in engine.module.parameters()]
    tensors += [p for group in base.param_groups for p in group["params"]]
    tensors += [v for st in base.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
    return [t.detach().float().clone() for t in tensors]


def _counters(engine):
    return engine.global_steps, engine.skipped_steps, engine.lr_scheduler.last_batch_iteration


def _one_layout(rank, zero, placement, bf16=False):
    import torch

    import ds_hetero
    from ds_hetero.toy import tiny_llava
    from ds_hetero.testing.batches import llava_samples

    model = tiny_llava("clip", seed=3)
    engine = ds_hetero.initialize(model, _config(zero, placement, bf16))
    batches = [llava_samples(model, 4, seed=s) for s in range(5)]
    out = {"results": []}
    out["results"].append(engine.train_batch(batches[0]))  # a good step: Adam state exists

    # 1. NaN in one image: every stage's gradients are NaN
    before = {n: (_state(e), _counters(e)) for n, e in engine.engines.items()}
    bad = [dict(s) for s in batches[1]]
    bad[0]["pixel_values"] = torch.full_like(bad[0]["pixel_values"], float("nan"))
    out["results"].append(engine.train_batch(bad))
    out["nan_pixels"] = _compare(engine, before)

    # 2. NaN gradients in the vision stage only: the language stage's own norm is finite
    before = {n: (_state(e), _counters(e)) for n, e in engine.engines.items()}
    hook = None
    if "vision" in engine.engines:
        param = next(p for p in engine.stages["vision"].module.parameters() if p.requires_grad)
        hook = param.register_hook(lambda g: g * float("nan"))
    out["results"].append(engine.train_batch(batches[2]))
    if hook is not None:
        hook.remove()
    out["nan_vision_grads"] = _compare(engine, before)

    # 3. the next good batches train normally
    before = {n: _state(e) for n, e in engine.engines.items()}
    out["results"] += [engine.train_batch(batches[3]), engine.train_batch(batches[4])]
    out["moved"] = {n: any(not torch.equal(a, b) for a, b in zip(before[n], _state(e)))
                    for n, e in engine.engines.items()}
    out["finite_after"] = {n: all(bool(torch.isfinite(t).all()) for t in _state(e)) for n, e in engine.engines.items()}
    out["results"] = [(r.loss, r.grad_norm, r.skipped) for r in out["results"]]
    engine.groups.destroy()
    return out


def _compare(engine, before):
    import torch

    out = {}
    for name, e in engine.engines.items():
        state, (steps, skipped, lr_it) = before[name]
        now = _state(e)
        out[name] = {
            "unchanged": len(state) > 0 and all(torch.equal(a, b) for a, b in zip(state, now)),
            "compared": len(state),
            "counters": (e.global_steps - steps, e.skipped_steps - skipped,
                         e.lr_scheduler.last_batch_iteration - lr_it),
        }
    return out


def _suite(rank, world_size):
    return {name: _one_layout(rank, **kw) for name, kw in RUNS.items()}


def test_a_non_finite_step_is_skipped_everywhere_and_training_continues():
    import math

    results = run_distributed(_suite, world_size=2, timeout=600)
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            steps = r["results"]
            assert [s[2] for s in steps] == [False, True, True, False, False], (rank, name, steps)
            assert all(math.isfinite(loss) for loss, _, _ in steps[3:]), (rank, name, steps)
            assert all(math.isfinite(norm) for _, norm, _ in steps[3:]), (rank, name, steps)
            for case in ("nan_pixels", "nan_vision_grads"):
                assert r[case], (rank, name, case)  # at least one stage engine compared
                for stage, c in r[case].items():
                    assert c["compared"] > 0 and c["unchanged"], (rank, name, case, stage, c)
                    # DeepSpeed's overflow bookkeeping: one step counted, one skipped, lr held
                    assert c["counters"] == (1, 1, 0), (rank, name, case, stage, c)
            assert all(r["moved"].values()) and all(r["finite_after"].values()), (rank, name, r)
