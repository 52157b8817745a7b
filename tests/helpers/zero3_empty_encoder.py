"""Shared by the ZeRO-3 empty-encoder tests: a Qwen2-VL whose vision dp ranks do not all get an
image in every pass, with the vision stage under ZeRO 3, against the Hugging Face reference."""

from ds_hetero.testing.parity import train_both


def encoder_shares(engine, batches):
    """`inspect` hook: per step and pass, how many images this rank's vision dp rank encodes
    (0: it runs the empty-rows path), read from the step's plan before training."""
    from ds_hetero.step.step_plan import StepPlan

    vision = engine.stages["vision"]
    if not vision.held:
        return {"images": None}
    counts = []
    for samples in batches:
        plan = StepPlan(engine.config, engine.adapter.encoders(), samples)
        counts.append([len(plan.encoder_items("vision", v, vision.coord.dp)) for v in range(vision.passes)])
    return {"images": counts}


def qwen2_vl_zero3_runs(rank, world_size, runs):
    """{name: train_both(...)} for Qwen2-VL runs of 5 steps with clipping 0.3."""
    return {name: train_both(rank, world_size, "qwen2_vl", inspect=encoder_shares, **{"steps": 5, "clip": 0.3, **kw})
            for name, kw in runs.items()}


def repro(rank, world_size):
    """The layout that hung: vision dp4 ZeRO 3, language tp2 dp2, 2 micro-batches of 4 samples."""
    return qwen2_vl_zero3_runs(rank, world_size, {"vision dp4 + language tp2dp2 zero3 sgd": dict(
        layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=3, optimizer="sgd",
        micro_batches=2, batch_size=8)})


def nested_dummy_pass(rank, world_size, timeout_s=10):
    """Negative control: the dummy pass calls the stage module from inside its own forward (the
    old empty-rows path), on the repro layout, for one step; expected to hang in the step, which
    `hetero_parallel.timeout_s` ends. 10 s: the wait is the test's cost, and the ranks' skew at a
    collective before the step stays far below it even on a loaded machine (the test asserts the
    timeout came in step 0, so an earlier one fails it rather than passing it)."""
    from ds_hetero.models import language_stage as stages

    right = stages.empty_rows

    def nested(stage, dummy_inputs):
        rows = stage(**dummy_inputs)
        return rows[:0] + 0 * rows.sum()

    stages.empty_rows = nested
    import ds_hetero.families.qwen2_vl.adapter as qwen2_vl

    saved, qwen2_vl.empty_rows = qwen2_vl.empty_rows, nested
    try:
        return qwen2_vl_zero3_runs(rank, world_size, {"nested": dict(
            layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=3, optimizer="sgd",
            micro_batches=2, batch_size=8, steps=1, hetero={"timeout_s": timeout_s})})
    finally:
        stages.empty_rows, qwen2_vl.empty_rows = right, saved
