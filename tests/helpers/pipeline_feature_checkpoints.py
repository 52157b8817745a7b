"""The ranks' side of tests/pipeline/test_pipeline_feature_checkpoints.py: checkpoints of a pipelined
language stage with tied input/output embeddings, and with ZeRO 3, in one 4-rank launch.

Tied LLaVA (each engine starts from other weights, seed 99, so the checkpoint must replace them all):
    TA  vision dp4, language pp2 [2, 2] dp2, ZeRO 1: 2 steps, save ckpt_ta, 2 more steps
    TA2 TA's layout: load ckpt_ta (DeepSpeed's own per-chunk load), 2 steps: TA's losses exactly
    TB  vision tp2 dp2, language tp2 dp2 (pp 1), ZeRO 2: load ckpt_ta (pp2 -> pp1), 2 steps, save ckpt_tb
    TC  vision dp4, language tp2 pp2 [1, 3], ZeRO 0: load ckpt_tb (pp1 -> pp2, tp 2), 2 steps, save ckpt_tc
    TD  TA's layout: load ckpt_tc (pp2 tp2 ZeRO 0 -> pp2 dp2 ZeRO 1), 2 steps
    TX  TC again with the head's copy left out of the reshard (negative control)
    TF  a copy of ckpt_ta whose last chunk does not mark the head as the tied weight's copy:
        refused on every rank (a parameter saved by two chunks), nothing changed
ZeRO 3 (untied LLaVA, vision dp4 + language pp2 dp2, ZeRO 3 on both stages):
    Z   2 steps, save_pretrained(hf_z), save ckpt_z, 2 more steps
    Z2  Z's layout: load ckpt_z, 2 steps: Z's losses exactly
    Z3  Z's layout from `meta_model(hf_z)` with `weights=hf_z` (per-shard loading): Z's saved weights
    Z4  language pp1 dp4, ZeRO 3: load ckpt_z refused on every rank (ZeRO 3 reshards nowhere)
"""

import json
import os
import shutil

from tests.helpers.pipeline_checkpoints import BATCH, FOUR_LAYERS, MICRO, STEPS, portable

TIED = {**FOUR_LAYERS, "tie_word_embeddings": True}
TIED_NAME = "model.language_model.embed_tokens.weight"

TA = dict(layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero=1)
TB = dict(layout={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}}, zero=2)
TC = dict(layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 1, "pp": 2, "pp_layers": [1, 3]}}, zero=0)
Z = dict(layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero=3)
Z4 = dict(layout={"vision": {"dp": 4}, "language": {"dp": 4}}, zero=3)


def batches(model_kw):
    from ds_hetero.testing.parity import build_model, make_batches

    return make_batches("llava", build_model("llava", seed=7, **model_kw), 4 * STEPS, BATCH)


def _unmark_shared_copy(src, dst):
    """A copy of checkpoint dir `src` whose last chunk's params.json has no `shared_copy` mark."""
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "latest")) as f:
        tag = f.read().strip()
    path = os.path.join(dst, tag, "language", "pp_01", "params.json")
    with open(path) as f:
        meta = json.load(f)
    for info in meta["params"].values():
        info.pop("shared_copy", None)
    with open(path, "w") as f:
        json.dump(meta, f)


def _fresh_zero3_counters():
    """DeepSpeed numbers ZeRO-3 parameters and modules with process-wide counters its trace check
    compares across ranks; ranks of different pipeline chunks count differently, so every ZeRO-3
    engine here starts them afresh, as a new process would (tests/helpers/pipeline_sequence.py)."""
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
    from deepspeed.runtime.zero.partition_parameters import Init

    Init.param_id = 0
    DeepSpeedZeRoOffload._register_deepspeed_module.__defaults__[0][0] = 0


def tied_chain(rank, world_size, tmp):
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.checkpoint import CheckpointError
    from ds_hetero.testing.parity import build_model, full_named_parameters
    from tests.helpers.checkpoint_reference import config, live_full_state, make_optimizer

    data = batches(TIED)
    first, second, third, fourth = (data[i * STEPS:(i + 1) * STEPS] for i in range(4))
    out = {}

    def engine_for(spec, seed):
        return ds_hetero.initialize(build_model("llava", seed=seed, **TIED),
                                    config(**spec, batch_size=BATCH, micro_batches=MICRO), optimizer=make_optimizer)

    def copy_of(engine):
        """This rank's copy of the tied weight after the run (None where it holds none)."""
        language = engine.stages.language
        if not language.held or language.tied is None:
            return None
        return dict(shared=language.tied.shared, value=full_named_parameters(engine)[TIED_NAME].tolist())

    def run(name, spec, load, steps_data, save=None):
        engine = engine_for(spec, 99)
        engine.load_checkpoint(os.path.join(tmp, load))
        out[f"{name}_step"] = engine.global_steps
        out[f"{name}_losses"] = [engine.train_batch(s).loss for s in steps_data]
        out[f"{name}_copy"] = copy_of(engine)
        if save:
            engine.save_checkpoint(os.path.join(tmp, save))
            out[f"state_{name}"] = portable(live_full_state(engine))
        engine.groups.destroy()

    engine = engine_for(TA, 7)
    out["ta_first"] = [engine.train_batch(s).loss for s in first]
    engine.save_checkpoint(os.path.join(tmp, "ckpt_ta"))
    out["state_ta"] = portable(live_full_state(engine))
    out["ta_losses"] = [engine.train_batch(s).loss for s in second]
    out["ta_copy"] = copy_of(engine)
    engine.groups.destroy()

    run("ta2", TA, "ckpt_ta", second)
    run("tb", TB, "ckpt_ta", second, save="ckpt_tb")
    run("tc", TC, "ckpt_tb", third, save="ckpt_tc")
    run("td", TA, "ckpt_tc", fourth)

    # TX (negative control): TC's load with the head's copy left out of the reshard: it keeps its
    # own (seed 99) weights, so the copies differ and the continuation misses the reference
    from ds_hetero.checkpoint import store
    from ds_hetero.stages.tied_embeddings import is_shared_copy

    real = store.apply_full_state

    def without_shared_copy(engine, params, *args):
        real(engine, {n: p for n, p in params.items() if not is_shared_copy(p)}, *args)

    store.apply_full_state = without_shared_copy
    try:
        run("tx", TC, "ckpt_tb", third)
    finally:
        store.apply_full_state = real

    # TF: the head's copy not marked as such: one parameter saved by two chunks, refused everywhere
    if rank == 0:
        _unmark_shared_copy(os.path.join(tmp, "ckpt_ta"), os.path.join(tmp, "ckpt_tbad"))
    dist.barrier()
    engine = engine_for(TB, 3)
    before = full_named_parameters(engine)
    try:
        engine.load_checkpoint(os.path.join(tmp, "ckpt_tbad"))
        out["refused"] = None
    except CheckpointError as exc:
        out["refused"] = str(exc)
    after = full_named_parameters(engine)
    out["unchanged"] = bool(len(before) > 0 and all(before[n].equal(after[n]) for n in before))
    engine.groups.destroy()
    dist.barrier()
    return out


def zero3_chain(rank, world_size, tmp):
    import torch
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.checkpoint import CheckpointError
    from ds_hetero.testing.parity import build_model, full_named_parameters
    from tests.helpers.checkpoint_reference import config, make_optimizer

    data = batches(FOUR_LAYERS)
    first, second = data[:STEPS], data[STEPS:2 * STEPS]
    hf_dir, ckpt = os.path.join(tmp, "hf_z"), os.path.join(tmp, "ckpt_z")
    out = {}

    def engine_for(spec, model, **kw):
        _fresh_zero3_counters()
        return ds_hetero.initialize(model, config(**spec, batch_size=BATCH, micro_batches=MICRO),
                                    optimizer=make_optimizer, **kw)

    engine = engine_for(Z, build_model("llava", seed=7, **FOUR_LAYERS))
    out["z_first"] = [engine.train_batch(s).loss for s in first]
    engine.save_pretrained(hf_dir)
    engine.save_checkpoint(ckpt)
    saved = full_named_parameters(engine)  # this rank's chunks' full weights, by the model's names
    out["z_losses"] = [engine.train_batch(s).loss for s in second]
    engine.groups.destroy()

    engine = engine_for(Z, build_model("llava", seed=99, **FOUR_LAYERS))
    engine.load_checkpoint(ckpt)
    out["z2_step"] = engine.global_steps
    out["z2_losses"] = [engine.train_batch(s).loss for s in second]
    engine.groups.destroy()

    # per-shard loading of the save_pretrained files into the same layout: the saved weights
    engine = engine_for(Z, ds_hetero.meta_model(hf_dir), weights=hf_dir)
    got = full_named_parameters(engine)
    out["z3_same_names"] = sorted(got) == sorted(saved)
    out["z3_diff"] = max((got[n] - saved[n]).abs().max().item() for n in saved)
    out["z3_losses"] = [engine.train_batch(s).loss for s in second]
    engine.groups.destroy()

    # every rank's saved weights against the files' (from_pretrained on rank 0)
    parts = [None] * world_size
    dist.all_gather_object(parts, {n: t.numpy() for n, t in saved.items()})
    if rank == 0:
        from transformers import AutoModelForImageTextToText

        files = dict(AutoModelForImageTextToText.from_pretrained(hf_dir, dtype=torch.float32).named_parameters())
        live = {n: torch.from_numpy(v) for p in parts for n, v in p.items()}
        out["hf_names"] = sorted(files) == sorted(live)
        out["hf_diff"] = max((files[n].detach() - live[n]).abs().max().item() for n in live)
        untrained = dict(build_model("llava", seed=7, **FOUR_LAYERS).named_parameters())
        out["hf_control"] = max((untrained[n].detach() - live[n]).abs().max().item() for n in live)

    # a layout change with ZeRO 3: refused on every rank, before anything is loaded
    engine = engine_for(Z4, build_model("llava", seed=3, **FOUR_LAYERS))
    try:
        engine.load_checkpoint(ckpt)
        out["z4_refused"] = None
    except CheckpointError as exc:
        out["z4_refused"] = str(exc)
    engine.groups.destroy()
    dist.barrier()
    return out


def feature_chains(rank, world_size, tmp):
    """Both chains in one launch (each 4-rank launch costs minutes)."""
    return {"tied": tied_chain(rank, world_size, tmp), "zero3": zero3_chain(rank, world_size, tmp)}
