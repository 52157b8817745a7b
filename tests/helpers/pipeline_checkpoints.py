"""The ranks' side of tests/pipeline/test_pipeline_checkpoints.py: a chain of checkpoints across pipeline
layouts, in one 4-rank launch (each engine of it starts from other weights, seed 99, so the
checkpoint must replace them all).

    A   vision dp4, language pp2 [2, 2] dp2, ZeRO 1: 2 steps, save ckpt_a, 2 more steps
    A2  A's layout: load ckpt_a (DeepSpeed's own per-chunk load), 2 steps: A's losses exactly
    B   vision tp2 dp2, language tp2 dp2 (pp 1), ZeRO 2: load ckpt_a (pp2 -> pp1), 2 steps, save ckpt_b
    C   vision dp4, language tp2 pp2 [1, 3], ZeRO 0: load ckpt_b (pp1 -> pp2), 2 steps, save ckpt_c
    D   A's layout: load ckpt_c (pp2 [1, 3] tp2 -> pp2 [2, 2] dp2, ZeRO 0 -> 1), 2 steps
    E   disaggregated, vision on rank 0, language pp3 on ranks 1-3, ZeRO 1: load ckpt_c, the same
        2 steps as D, save ckpt_e (a vision-only rank writes the manifest of a pipelined stage)
    F   a copy of ckpt_c whose manifest says the cut was [2, 2]: refused on every rank (the
        chunks' recorded layers do not match it), nothing changed
"""

import json
import os
import shutil

FOUR_LAYERS = dict(text_layers=4)
STEPS = 2
BATCH, MICRO = 16, 4

A = dict(layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero=1)
B = dict(layout={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}}, zero=2)
C = dict(layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 1, "pp": 2, "pp_layers": [1, 3]}}, zero=0)
E = dict(layout={"vision": {"dp": 1, "ranks": [0]}, "language": {"dp": 1, "pp": 3, "ranks": [1, 2, 3]}}, zero=1,
         placement="disaggregated")


def batches():
    from ds_hetero.testing.parity import build_model, make_batches

    return make_batches("llava", build_model("llava", seed=7, **FOUR_LAYERS), 4 * STEPS, BATCH)


def portable(state):
    """numpy, not tensors: torch passes tensors between processes by shared memory, which the
    pytest process can no longer open once the rank has exited."""
    return {n: {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in e.items()} for n, e in state.items()}


def _tamper_cut(src, dst, cut):
    """A copy of checkpoint dir `src` whose manifest records another layer cut (the files unchanged)."""
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "latest")) as f:
        tag = f.read().strip()
    path = os.path.join(dst, tag, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    manifest["stages"]["language"]["pp_layers"] = cut
    with open(path, "w") as f:
        json.dump(manifest, f)


def chain(rank, world_size, tmp):
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.checkpoint import CheckpointError
    from ds_hetero.testing.parity import build_model, full_named_parameters
    from tests.helpers.checkpoint_reference import config, live_full_state, make_optimizer

    data = batches()
    first, second, third, fourth = (data[i * STEPS:(i + 1) * STEPS] for i in range(4))
    out = {}

    def engine_for(spec, seed):
        return ds_hetero.initialize(build_model("llava", seed=seed, **FOUR_LAYERS),
                                    config(**spec, batch_size=BATCH, micro_batches=MICRO), optimizer=make_optimizer)

    def run(name, spec, load, steps_data, save=None):
        engine = engine_for(spec, 99)
        if load:
            engine.load_checkpoint(os.path.join(tmp, load))
            out[f"{name}_step"] = engine.global_steps
        out[f"{name}_losses"] = [engine.train_batch(s).loss for s in steps_data]
        out[f"{name}_held"] = [s.name for s in engine.stages.held]
        if save:
            engine.save_checkpoint(os.path.join(tmp, save))
            out[f"state_{name}"] = portable(live_full_state(engine))
            out[f"{name}_files"] = sorted(os.listdir(os.path.join(tmp, save, f"global_step{engine.global_steps}",
                                                                  "language")))
        engine.groups.destroy()

    engine = engine_for(A, 7)
    out["a_first"] = [engine.train_batch(s).loss for s in first]
    engine.save_checkpoint(os.path.join(tmp, "ckpt_a"))
    out["state_a"] = portable(live_full_state(engine))
    out["a_files"] = sorted(os.listdir(os.path.join(tmp, "ckpt_a", f"global_step{STEPS}", "language")))
    out["a_losses"] = [engine.train_batch(s).loss for s in second]
    engine.groups.destroy()

    run("a2", A, "ckpt_a", second)
    run("b", B, "ckpt_a", second, save="ckpt_b")
    run("c", C, "ckpt_b", third, save="ckpt_c")
    run("d", A, "ckpt_c", fourth)
    run("e", E, "ckpt_c", fourth, save="ckpt_e")

    # F: the manifest's cut disagrees with the chunks' recorded layers: refused, weights untouched
    if rank == 0:
        _tamper_cut(os.path.join(tmp, "ckpt_c"), os.path.join(tmp, "ckpt_bad"), [2, 2])
    dist.barrier()
    engine = engine_for(B, 3)
    before = full_named_parameters(engine)
    try:
        engine.load_checkpoint(os.path.join(tmp, "ckpt_bad"))
        out["refused"] = None
    except CheckpointError as exc:
        out["refused"] = str(exc)
    after = full_named_parameters(engine)
    out["unchanged"] = bool(len(before) > 0 and all(before[n].equal(after[n]) for n in before))
    engine.groups.destroy()
    dist.barrier()
    return out
