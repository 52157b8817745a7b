"""Stages on the same ranks in the same layout share one DeepSpeed engine (stages/shared_engine.py).

Against the single-process Hugging Face reference (losses 1e-5, norms 1e-4, every weight 1e-5 after
5 steps with clipping active): ZeRO 1 AdamW at tp2dp2 with the vision stage in one pass and the
language stage in two micro-batches (each stage's passes scale its own backward), ZeRO 0 SGD at
dp4 with the reference's negative controls, ZeRO 1 AdamW at dp4. The engine is one object and a
step makes one gradient reduction for both stages; ZeRO 2, or stages at different ZeRO stages,
keep one engine per stage. Negative control: the same shared run (SGD, no clip) with each
backward left unscaled by its stage's passes misses the reference.

Checkpoints: a shared engine's checkpoint resumes in its own layout with DeepSpeed's load (the
same losses as the run that saved it), and moves to separate engines and back like any layout
change, each continuing like a single-process run from the same full state. In bf16 the shared
engine's norms and losses follow fp32's to bf16 rounding.
"""

import os

import pytest

from ds_hetero.testing.cases import launch_cases
from ds_hetero.testing.parity import train_both
from tests.helpers.parity_checks import CLIP, RTOL, check_parity

pytestmark = pytest.mark.distributed

SHARED_TP2 = {"vision": {"tp": 2, "dp": 2, "micro_batches": 1}, "language": {"tp": 2, "dp": 2}}
SHARED_DP4 = {"vision": {"dp": 4}, "language": {"dp": 4}}
SEPARATE = {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}
CKPT_STEPS = 2


def _shared_suite(rank, world_size):
    import torch.distributed as dist

    def unscaled(engine, batches):  # the negative control: no stage's backward divided by its passes
        for stage in engine.stages.held:
            def backward(loss, stage=stage):
                with stage.context():
                    stage.engine.backward(loss)
            stage.backward = backward
        return {"shared": engine.engines["vision"] is engine.engines["language"]}

    def shared(engine, batches):
        return {"shared": engine.engines["vision"] is engine.engines["language"],
                "held": sorted(engine.engines)}

    def collectives(engine, batches):
        """The collectives of the run's second step (the first also checks the boundary's inputs),
        counted by wrapping torch.distributed's functions while it runs."""
        names = ("all_reduce", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "broadcast")
        calls = dict.fromkeys(names, 0)
        originals = {name: getattr(dist, name) for name in names}

        def counting(name):
            def call(*args, **kwargs):
                calls[name] += 1
                return originals[name](*args, **kwargs)
            return call

        step, seen = engine.train_batch, []

        def second_step(samples):
            seen.append(1)
            if len(seen) != 2:
                return step(samples)
            for name in names:
                setattr(dist, name, counting(name))
            try:
                return step(samples)
            finally:
                for name, fn in originals.items():
                    setattr(dist, name, fn)

        engine.train_batch = second_step
        return {"shared": engine.engines["vision"] is engine.engines["language"], "calls": calls}

    runs = {
        "shared tp2dp2 zero1 adamw, vision in one pass": dict(layout=SHARED_TP2, zero_stage=1, inspect=shared),
        "shared dp4 zero1 adamw": dict(layout=SHARED_DP4, zero_stage=1, inspect=collectives),
        "shared dp4 zero0 sgd": dict(layout=SHARED_DP4, zero_stage=0, optimizer="sgd", controls=True, inspect=shared),
    }
    out = {name: train_both(rank, world_size, "llava", **{"steps": 5, "clip": CLIP, **kw}) for name, kw in runs.items()}
    controls = {
        # without clipping: a clip would hide the error, as every gradient then scales alike (the
        # vision stage's come from the language stage's backward)
        "unscaled passes (negative control)": dict(layout=SHARED_TP2, zero_stage=1, optimizer="sgd", clip=0.0,
                                                   inspect=unscaled),
        "tp2dp2 zero2: one engine per stage": dict(layout=SHARED_TP2, zero_stage=2, steps=1, inspect=shared),
        "dp4, vision ZeRO 0 and language ZeRO 1: one engine per stage": dict(
            layout={"vision": {"dp": 4, "zero_stage": 0}, "language": {"dp": 4}}, zero_stage=1, steps=2,
            inspect=collectives),
    }
    for name, kw in controls.items():
        out[name] = train_both(rank, world_size, "llava", **{"steps": 3, "clip": CLIP, **kw})
    out["bf16"] = _bf16_against_fp32()
    return out


def _bf16_against_fp32():
    """The shared engine in bf16 (ZeRO 1: DeepSpeed's ZeRO optimizer, gradients accumulated in the
    parameters' dtype) against fp32: the same batches, norms and losses to bf16 rounding. A lost
    micro-batch (the first one's gradients dropped before the reduction) would move the norm by a
    third or more."""
    import ds_hetero
    from ds_hetero.testing.parity import build_model, make_batches
    from tests.helpers.checkpoint_reference import config, make_optimizer

    batches = make_batches("llava", build_model("llava", seed=7), 3, 8)
    out = {}
    for bf16 in (False, True):
        cfg = config(SHARED_TP2, 1)
        if bf16:
            cfg["bf16"] = {"enabled": True}
        engine = ds_hetero.initialize(build_model("llava", seed=7), cfg, optimizer=make_optimizer)
        results = [engine.train_batch(b) for b in batches]
        out[bf16] = {"shared": engine.engines["vision"] is engine.engines["language"],
                     "losses": [r.loss for r in results], "norms": [r.grad_norm for r in results]}
        engine.groups.destroy()
    return out


def _checkpoint_chain(rank, world_size, tmp):
    """S (shared) saves, S2 resumes in S's layout, A (separate engines) loads S's checkpoint and
    saves, S3 (shared) loads A's: every continuation is recorded with the full state it started from."""
    import ds_hetero
    from ds_hetero.testing.parity import build_model, make_batches
    from tests.helpers.checkpoint_reference import config, live_full_state, make_optimizer
    from tests.checkpoint.test_checkpoint_layouts import _portable

    batches = make_batches("llava", build_model("llava", seed=7), 3 * CKPT_STEPS, 8)
    first, second, third = batches[:CKPT_STEPS], batches[CKPT_STEPS:2 * CKPT_STEPS], batches[2 * CKPT_STEPS:]
    out = {}

    def engine_for(layout, seed):
        return ds_hetero.initialize(build_model("llava", seed=seed), config(layout, 1), optimizer=make_optimizer)

    engine = engine_for(SHARED_TP2, 7)
    out["s_shared"] = engine.engines["vision"] is engine.engines["language"]
    for s in first:
        engine.train_batch(s)
    engine.save_checkpoint(os.path.join(tmp, "ckpt_s"))
    out["state_s"] = _portable(live_full_state(engine))
    out["s_continued"] = [engine.train_batch(s).loss for s in second]
    engine.groups.destroy()

    engine = engine_for(SHARED_TP2, 99)  # other initial weights: the load must replace them
    engine.load_checkpoint(os.path.join(tmp, "ckpt_s"))
    out["s2_continued"] = [engine.train_batch(s).loss for s in second]
    engine.groups.destroy()

    engine = engine_for(SEPARATE, 99)
    out["a_shared"] = engine.engines["vision"] is engine.engines["language"]
    engine.load_checkpoint(os.path.join(tmp, "ckpt_s"))
    out["a_continued"] = [engine.train_batch(s).loss for s in second]
    engine.save_checkpoint(os.path.join(tmp, "ckpt_a"))
    out["state_a"] = _portable(live_full_state(engine))
    engine.groups.destroy()

    engine = engine_for(SHARED_TP2, 99)
    engine.load_checkpoint(os.path.join(tmp, "ckpt_a"))
    out["s3_continued"] = [engine.train_batch(s).loss for s in third]
    engine.groups.destroy()
    out["files"] = sorted(os.listdir(os.path.join(tmp, "ckpt_s", "global_step2", "language")))
    return out


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("shared_ckpt"))
    cases = {"suite": (_shared_suite, {}), "checkpoints": (_checkpoint_chain, {"tmp": tmp})}
    return launch_cases(cases, world_size=4, timeout=1200)


def test_shared_engine_matches_single_process_reference(launched):
    runs = [{k: v for k, v in r.items() if k.startswith("shared")} for r in launched["suite"]]
    check_parity(runs)
    for per_rank in launched["suite"]:
        for name in ("shared tp2dp2 zero1 adamw, vision in one pass", "shared dp4 zero1 adamw", "shared dp4 zero0 sgd"):
            assert per_rank[name]["shared"], name


def test_shared_step_reduces_once(launched):
    """dp4 (no tp collectives), a step after the first: the batch agreement, one gradient
    reduction for both stages and the norms' combination are 3 all-reduces; with one engine per
    stage (the control: the stages' ZeRO stages differ) each engine reduces its own."""
    for per_rank in launched["suite"]:
        calls = per_rank["shared dp4 zero1 adamw"]["calls"]
        assert calls["all_reduce"] == 3, calls
        separate = per_rank["dp4, vision ZeRO 0 and language ZeRO 1: one engine per stage"]
        assert not separate["shared"] and separate["calls"]["all_reduce"] == 4, separate["calls"]


def test_shared_engine_in_bf16_follows_fp32(launched):
    for per_rank in launched["suite"]:
        fp32, bf16 = per_rank["bf16"][False], per_rank["bf16"][True]
        assert fp32["shared"] and bf16["shared"]
        for a, b in zip(fp32["norms"], bf16["norms"]):
            assert abs(a - b) <= 0.03 * a, (fp32["norms"], bf16["norms"])  # measured: under 1%
        for a, b in zip(fp32["losses"], bf16["losses"]):
            assert abs(a - b) <= 0.005 * a, (fp32["losses"], bf16["losses"])


def test_negative_control_and_zero2_stay_apart(launched):
    for per_rank in launched["suite"]:
        control = per_rank["unscaled passes (negative control)"]
        assert control["shared"]
        rel, _, _, compared = control["weight_err"]
        assert compared > 0 and rel > 100 * RTOL, control["weight_err"]
        assert not per_rank["tp2dp2 zero2: one engine per stage"]["shared"]


def test_shared_checkpoints_resume_and_move_between_layouts(launched):
    from tests.checkpoint.test_checkpoint_layouts import _assert_close, _merge
    from tests.helpers.checkpoint_reference import continue_single_process
    from ds_hetero.testing.parity import build_model, make_batches

    results = launched["checkpoints"]
    r0 = results[0]
    assert r0["s_shared"] and not r0["a_shared"]
    # the shared engine's files are in the vision stage's folder; the language's holds its params.json
    assert r0["files"] == ["params.json"], r0["files"]
    batches = make_batches("llava", build_model("llava", seed=7), 3 * CKPT_STEPS, 8)
    second, third = batches[CKPT_STEPS:2 * CKPT_STEPS], batches[2 * CKPT_STEPS:]
    reference = continue_single_process(_merge(results, "state_s"), second)
    _assert_close(r0["s_continued"], reference, "the shared run, uninterrupted")
    assert r0["s2_continued"] == r0["s_continued"], (r0["s2_continued"], r0["s_continued"])  # DeepSpeed's own load
    _assert_close(r0["a_continued"], reference, "shared -> separate engines")
    _assert_close(r0["s3_continued"], continue_single_process(_merge(results, "state_a"), third),
                  "separate engines -> shared")
