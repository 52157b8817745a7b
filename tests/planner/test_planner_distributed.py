"""The planner against real engines, in one 4-rank launch:

1. model-state memory per ZeRO stage: the optimizer state DeepSpeed actually allocates in each
   stage engine (fp32 master partition, Adam moments) and the parameters each rank holds equal
   the planner's `state_elements` (up to DeepSpeed's partition padding), for ZeRO 0, 1, 2, 3;
   negative control: the prediction for the wrong ZeRO stage does not match;
2. `"hetero_parallel": {"auto": true, ...}`: rank 0 plans, every rank trains with the same
   choice (which is the planner's top pick), the loss is finite and falls;
3. a bad auto key raises the same HeteroConfigError on every rank, before any collective.
"""

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed


def _config(zero, **section):
    return {
        "train_batch_size": 8,
        "zero_optimization": {"stage": zero},
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "torch_adam": True}},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**6,
        "hetero_parallel": section or {"micro_batches": 1, "stages": {
            "vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}},
    }


def _measured_states(engine, zero):
    """(params held, fp32 master elements, Adam moment elements) of one DeepSpeed stage engine."""
    opt = engine.optimizer
    module = engine.module  # the stage module; the optimizer holds its trainable parameters only
    trained = module.trainable_parameters() if hasattr(module, "trainable_parameters") else module.parameters()
    params = sum((p.ds_tensor.numel() if zero == 3 else p.numel()) for p in trained)
    if zero == 0:
        masters, inner = [], opt
    elif zero == 3:
        masters, inner = list(opt.fp32_partitioned_groups_flat), opt.optimizer
    else:
        masters, inner = list(opt.single_partition_of_fp32_groups), opt.optimizer
    moments = sum(t.numel() for st in inner.state.values() for k, t in st.items() if k in ("exp_avg", "exp_avg_sq"))
    return params, sum(m.numel() for m in masters), moments


def _suite(rank, world_size):
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.toy import ShapesCaptionDataset
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.toy import tiny_llava
    from ds_hetero.planner.candidate import StageChoice
    from ds_hetero.planner.memory import state_elements
    from ds_hetero.planner.model_spec import model_spec

    out = {"memory": {}, "control": {}}
    for zero in (0, 1, 2, 3):
        model = tiny_llava("clip", seed=3)
        spec = model_spec(model.config)
        data = ShapesCaptionDataset.for_llava(model.config, size=16, seed=0)
        engine = ds_hetero.initialize(model, _config(zero), training_data=data)
        engine.train_batch()  # optimizer state is created at the first step
        for stage, layout in (("vision", StageChoice(1, 4)), ("language", StageChoice(2, 2))):
            measured = _measured_states(engine.engines[stage], zero)
            want = state_elements(spec.params_per_rank(stage, layout.tp), layout, zero)
            out["memory"][(zero, stage)] = (measured, (want.params, want.master, want.moments))
            wrong = state_elements(spec.params_per_rank(stage, layout.tp), layout, 1 if zero == 0 else 0)
            out["control"][(zero, stage)] = (wrong.params, wrong.master, wrong.moments)
        del engine

    # 2. auto: plan on rank 0, broadcast, train
    model = tiny_llava("clip", seed=3)
    data = ShapesCaptionDataset.for_llava(model.config, size=64, seed=0)
    auto = _config(1, auto=True, seq_len=96, machine="cpu", placement="colocated")
    engine = ds_hetero.initialize(model, auto, training_data=data)
    chosen = engine.config
    losses = [engine.train_batch().loss for _ in range(4)]
    out["auto"] = ({n: (s.tp, s.cp, s.dp) for n, s in chosen.stages.items()}, chosen.placement,
                   chosen.micro_batches, losses)
    if rank == 0:  # the planner's top pick, computed again here without processes
        from ds_hetero.planner import machine_profile, plan

        p = plan(model, world_size, 96, 16, 8, machine_profile("cpu"), base={k: v for k, v in auto.items()
                                                                            if k != "hetero_parallel"},
                 placements=("colocated",))
        c = p.best.candidate
        out["top"] = ({"vision": (c.vision.tp, 1, c.vision.dp), "language": (c.language.tp, c.language.cp,
                                                                              c.language.dp)}, c.micro_batches)
    del engine
    dist.barrier()

    # 3. a bad auto key: the same error on every rank
    try:
        ds_hetero.initialize(tiny_llava("clip", seed=3), _config(1, auto=True, seqlen=96))
        out["bad"] = None
    except HeteroConfigError as exc:
        out["bad"] = str(exc)
    return out


def test_zero_memory_and_auto():
    results = run_distributed(_suite, world_size=4, timeout=900, pg_timeout_s=300)
    compared = 0
    for rank, out in enumerate(results):
        for key, ((params, master, moments), (w_params, w_master, w_moments)) in out["memory"].items():
            # DeepSpeed pads each partition to an alignment of a few elements per rank
            assert params == pytest.approx(w_params, abs=8), (rank, key)
            assert master == pytest.approx(w_master, abs=8), (rank, key, master, w_master)
            assert moments == pytest.approx(w_moments, abs=16), (rank, key, moments, w_moments)
            c_params, c_master, c_moments = out["control"][key]
            assert (c_master, c_moments) != pytest.approx((master, moments), abs=16), key  # can fail
            compared += 1
        stages, placement, mb, losses = out["auto"]
        assert (stages, placement, mb) == results[0]["auto"][:3]  # every rank trains the same choice
        assert all(l == l and l < 20 for l in losses) and losses[-1] < losses[0]
        assert out["bad"] is not None and "hetero_parallel.seqlen" in out["bad"]
    assert compared == 4 * 4 * 2
    stages, placement, mb, _ = results[0]["auto"]
    assert (stages, mb) == results[0]["top"] and placement == "colocated"
