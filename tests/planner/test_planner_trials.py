"""Measured trials: `"hetero_parallel": {"auto": true, "trial": 2}` on 2 gloo ranks, and the launcher
path's re-ranking (pure, with the launch replaced).

In-process: rank 0 plans and broadcasts the top 2 runnable configs, every rank runs both for 2
steps on a deep copy of the model, and every rank picks the same one: the fastest of the
max-reduced times, which are identical on every rank. The user's model is not stepped by the
trials, and initialize then trains with the pick.
"""

import pytest

from ds_hetero.testing.launch import run_distributed


def _auto_trial(rank, world_size):
    import torch

    import ds_hetero
    from ds_hetero.toy import tiny_llava
    from ds_hetero import trial_runner

    recorded = []
    real = trial_runner.trials_in_process

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        recorded.append(out)
        return out

    model = tiny_llava("clip", seed=3)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    cfg = {
        "train_batch_size": 4,
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**6,
        "hetero_parallel": {"auto": True, "trial": 2, "trial_steps": 2, "seq_len": 40, "machine": "cpu",
                            "placement": "colocated", "micro_batches": [1]},
    }
    from ds_hetero.planner.auto import resolve_auto

    chosen = resolve_auto(model, cfg, run_trials=recording)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    from ds_hetero.planner.trial_data import workload_samples

    engine = ds_hetero.initialize(model, chosen)
    loss = engine.train_batch(workload_samples(model.config, 40, 16, 4, seed=1)).loss
    return {"chosen": chosen["hetero_parallel"], "times": recorded[0], "unchanged": bool(torch.equal(before, after)),
            "loss": float(loss)}


@pytest.mark.distributed
def test_auto_trial_picks_the_fastest_measured_on_every_rank():
    results = run_distributed(_auto_trial, world_size=2, timeout=600, pg_timeout_s=300)
    times = results[0]["times"]
    assert len(times) == 2 and all(0 < t < float("inf") for t in times)
    for out in results:
        assert out["times"] == times  # max-reduced: every rank ranks the same numbers
        assert out["chosen"] == results[0]["chosen"]
        assert out["unchanged"]  # the trials stepped copies, not the user's model
        assert out["loss"] == out["loss"] and out["loss"] < 20
    # the pick is the faster trial: compare with the planner's order of the two
    from ds_hetero.toy import tiny_llava
    from ds_hetero.planner import machine_profile, plan

    p = plan(tiny_llava("clip", seed=3), 2, 40, 16, 4, machine_profile("cpu"), placements=("colocated",),
             micro_batches=(1,),
             base={"zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    top = [x.candidate.section() for x in p.runnable if x.fits][:2]  # auto's search: first_stage etc. included
    fastest = top[min(range(2), key=lambda i: times[i])]
    assert results[0]["chosen"] == fastest


def test_launch_trials_reranks_by_measured_time():
    from ds_hetero.planner import machine_profile, plan, trials

    p = plan("tiny-llava", 2, 40, 16, 4, machine_profile("cpu"), placements=("colocated",), micro_batches=(1,),
             modelled=False)
    fake = {0: [0.5, 0.7], 1: [0.2, 0.3], 2: [float("inf")]}  # the planner's #2 measures fastest; #3 fails
    calls = []

    def launch(model, cfg, world, seq, k, steps, workdir, tag, timeout_s=0):
        i, r = int(tag[5]), int(tag.split("_")[1])
        calls.append((i, r))
        t = fake[i][min(r, len(fake[i]) - 1)]
        return (t, "") if t != float("inf") else (t, "launch failed (exit 1): boom")

    out = trials.launch_trials("tiny-llava", p, 3, 2, launch, steps=2, rounds=2, log=lambda m: None)
    assert [t.prediction for t in out] == [p.runnable[1], p.runnable[0], p.runnable[2]]
    assert out[0].measured_s == pytest.approx(0.25) and out[2].measured_s == float("inf") and out[2].error
    # round-robin: A B C A B (the failed one is not retried)
    assert calls == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]
    assert "measured trials" in trials.trial_table(out)
