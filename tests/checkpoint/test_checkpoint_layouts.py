"""A checkpoint saved with one layout continues on another (tp, dp, placement, ZeRO 0/1/2)
exactly like a single-process run from the same full state (tests/helpers/checkpoint_reference.py).

One 4-rank launch runs the chain (each launch costs tens of seconds on this box):
    A  colocated, vision tp1dp4, language tp2dp2, ZeRO 1: 2 steps, save ckpt_a, 2 more steps
    B  colocated, vision tp2dp2, language tp1dp4, ZeRO 2: load ckpt_a (tp2dp2 -> tp1dp4, ZeRO 1 -> 2), 2 steps
    C  disaggregated vision [0,1] tp1dp2, language [2,3] tp2dp1, ZeRO 0: load ckpt_a, 2 steps,
       save ckpt_c (a ZeRO-0, disaggregated checkpoint)
    D  = A's layout: load ckpt_c (disaggregated ZeRO 0 -> colocated ZeRO 1), 2 steps
    E  a different model: refused on every rank, nothing changed
"""

import os

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

RTOL = 1e-5
STEPS = 2

A = dict(layout={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}, zero=1)
B = dict(layout={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 1, "dp": 4}}, zero=2)
C = dict(layout={"vision": {"tp": 1, "dp": 2, "ranks": [0, 1]}, "language": {"tp": 2, "dp": 1, "ranks": [2, 3]}},
         zero=0, placement="disaggregated")


def _chain(rank, world_size, tmp):
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.checkpoint import CheckpointError
    from tests.helpers.checkpoint_reference import config, live_full_state, make_optimizer
    from ds_hetero.testing.parity import build_model, full_named_parameters, make_batches

    batches = make_batches("llava", build_model("llava", seed=7), 3 * STEPS, 8)
    first, second, third = batches[:STEPS], batches[STEPS:2 * STEPS], batches[2 * STEPS:]
    out = {}

    def engine_for(spec, seed):
        return ds_hetero.initialize(build_model("llava", seed=seed), config(**spec), optimizer=make_optimizer)

    engine = engine_for(A, 7)
    out["a_first"] = [engine.train_batch(s).loss for s in first]
    engine.save_checkpoint(os.path.join(tmp, "ckpt_a"))
    out["state_a"] = _portable(live_full_state(engine))
    out["a_continued"] = [engine.train_batch(s).loss for s in second]
    engine.groups.destroy()

    for name, spec in (("b", B), ("c", C)):
        engine = engine_for(spec, 99)  # other initial weights: the checkpoint must replace them
        engine.load_checkpoint(os.path.join(tmp, "ckpt_a"))
        out[f"{name}_step"] = engine.global_steps
        out[f"{name}_continued"] = [engine.train_batch(s).loss for s in second]
        if name == "c":
            engine.save_checkpoint(os.path.join(tmp, "ckpt_c"))
            out["state_c"] = _portable(live_full_state(engine))
        engine.groups.destroy()

    engine = engine_for(A, 99)
    engine.load_checkpoint(os.path.join(tmp, "ckpt_c"))
    out["d_continued"] = [engine.train_batch(s).loss for s in third]
    engine.groups.destroy()

    # E: another model (a larger vocabulary) is refused on every rank, its weights untouched
    engine = ds_hetero.initialize(build_model("llava", seed=3, vocab=512), config(**B), optimizer=make_optimizer)
    before = full_named_parameters(engine)
    try:
        engine.load_checkpoint(os.path.join(tmp, "ckpt_a"))
        out["refused"] = None
    except CheckpointError as exc:
        out["refused"] = str(exc)
    after = full_named_parameters(engine)
    out["unchanged"] = bool(all(before[n].equal(after[n]) for n in before) and len(before) > 0)
    engine.groups.destroy()
    dist.barrier()
    return out


def _portable(state):
    """numpy, not tensors: torch passes tensors between processes by shared memory, which the
    pytest process can no longer open once the rank has exited."""
    return {n: {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in e.items()} for n, e in state.items()}


def _merge(results, key):
    import torch

    state = {}
    for r in results:
        state.update({n: {k: (torch.from_numpy(v) if hasattr(v, "shape") else v) for k, v in e.items()}
                      for n, e in r[key].items()})
    return state


def _assert_close(got, want, what):
    assert len(got) == len(want) == STEPS, (what, got, want)
    for g, w in zip(got, want):
        assert abs(g - w) <= RTOL * abs(w), (what, got, want)


def test_checkpoint_moves_between_layouts(tmp_path):
    from tests.helpers.checkpoint_reference import continue_single_process
    from ds_hetero.testing.parity import build_model, make_batches

    results = run_distributed(_chain, world_size=4, timeout=900, tmp=str(tmp_path))
    r0 = results[0]
    batches = make_batches("llava", build_model("llava", seed=7), 3 * STEPS, 8)
    second, third = batches[STEPS:2 * STEPS], batches[2 * STEPS:]

    state_a = _merge(results, "state_a")
    reference = continue_single_process(state_a, second)
    # the reference state is right: the uninterrupted run A continues like it
    _assert_close(r0["a_continued"], reference, "A uninterrupted vs single process from A's state")
    assert all(r["b_step"] == STEPS and r["c_step"] == STEPS for r in results)
    _assert_close(r0["b_continued"], reference, "tp2dp2 -> tp1dp4, ZeRO 1 -> 2")
    c_losses = next(r["c_continued"] for r in results if r["c_continued"])
    _assert_close(c_losses, reference, "colocated ZeRO 1 -> disaggregated ZeRO 0")
    assert all(r["c_continued"] == c_losses for r in results)  # vision ranks learn the loss too

    state_c = _merge(results, "state_c")
    _assert_close(r0["d_continued"], continue_single_process(state_c, third),
                  "disaggregated ZeRO 0 -> colocated ZeRO 1")

    # negative control: without the Adam moments the continuation is measurably different
    fresh = continue_single_process(state_a, second, moments=False)
    assert max(abs(g - w) / abs(w) for g, w in zip(r0["b_continued"], fresh)) > 100 * RTOL, (r0["b_continued"], fresh)

    for r in results:
        msg = r["refused"]
        assert msg is not None and "stage language: not the same model" in msg, msg  # every rank holds it
        assert r["unchanged"], "a refused load changed weights"
    msg = r0["refused"]
    assert "vision: saved tp1 cp1 dp4 ranks [0, 1, 2, 3], colocated, ZeRO 1, float32; current tp2 cp1 dp2" in msg, msg
