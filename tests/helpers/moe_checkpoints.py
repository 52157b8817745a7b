"""Training checkpoints of a Qwen3-VL-MoE language stage across ep, against one uninterrupted
single-process Hugging Face run (fp32, AdamW, DeepSpeed's WarmupLR, clipping active).

`checkpoint_chain`: K steps at ep2 (language tp2 dp2, ZeRO 1), save; load at ep1 (language dp4,
ZeRO 2), K steps, save; load at ep4 (language dp4, ZeRO 0), K steps. Every loss, aux loss and norm
of the 3K steps against the reference's, and the ep4 engine's final weights (experts gathered).
`convert_to_hf` of the ep2 checkpoint equals the live engine's weights.
Negative controls: the ep1 checkpoint loaded at ep4 with each rank's experts taken from the next
ep slot (reshard.py `expert_slot`) must miss the bar; an ep2 checkpoint whose two expert files
are swapped (each file holds the other rank's experts) is refused on every rank, nothing changed; that
engine then loads the real ep2 checkpoint (the same layout) and continues like the reference.
"""

from __future__ import annotations

import copy
import os
import shutil

import torch

from ds_hetero.testing.parity import full_named_parameters, max_rel_err
from tests.helpers.moe_parity import CLIP, make_batches, reference_loss

K = 2  # steps per segment
V = {"tp": 1, "dp": 4}
EP2 = dict(layout={"vision": V, "language": {"tp": 2, "dp": 2, "ep": 2}}, zero=1)
EP1 = dict(layout={"vision": V, "language": {"tp": 1, "dp": 4}}, zero=2)
EP4 = dict(layout={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 1, "dp": 4, "ep": 4}}, zero=0)
# disaggregated: vision on ranks 0-1, the ep2 language stage on 2-3 (whose ranks call no DeepSpeed save)
EPD = dict(layout={"vision": {"dp": 2, "ranks": [0, 1]}, "language": {"tp": 1, "dp": 2, "ep": 2, "ranks": [2, 3]}},
           zero=1, placement="disaggregated")
# pipelined: language pp2 dp2 ep2 (each chunk's ep group its own 2 dp ranks; the cut [2, 1], the only one
# Qwen3-VL's DeepStack levels allow), ZeRO 1 and 2; 2 micro-batches each (the aux loss is per micro-batch)
EPP = dict(layout={"vision": V, "language": {"tp": 1, "dp": 2, "pp": 2, "ep": 2}}, zero=1, micro_batches=2)
EPP_Z2 = dict(EPP, zero=2)
EP2M2 = dict(EP2, micro_batches=2)
# ZeRO 3 on the language stage only (its own `zero_stage`; the vision stage keeps ZeRO 1): each expert
# partitioned over its 2 expert-data-parallel ranks, the dense weights over dp
EPP_Z3 = dict(layout={"vision": V, "language": {"tp": 1, "dp": 2, "pp": 2, "ep": 2, "zero_stage": 3}}, zero=1,
              micro_batches=2)
WARMUP = {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 10, "warmup_type": "linear"}


def make_optimizer(params):  # eps 1e-4: see ds_hetero/testing/parity.py
    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)


def _config(spec):
    return {"train_batch_size": 8, "zero_optimization": {"stage": spec["zero"]}, "zero_allow_untested_optimizer": True,
            "gradient_clipping": CLIP, "steps_per_print": 10**6,
            "scheduler": {"type": "WarmupLR", "params": dict(WARMUP)},
            "hetero_parallel": {"placement": spec.get("placement", "colocated"),
                                "micro_batches": spec.get("micro_batches", 1), "stages": spec["layout"]}}


def _engine(spec, seed):
    import ds_hetero
    from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe

    return ds_hetero.initialize(tiny_qwen3_vl_moe(seed=seed), _config(spec), optimizer=make_optimizer)


def _train(engine, batches):
    results = [engine.train_batch(s) for s in batches]
    return [r.loss for r in results], [r.aux_loss for r in results], [r.grad_norm for r in results]


def reference_run(batches, micro_batches=1):
    """The uninterrupted single-process run: model(**batch).loss (with several micro-batches the aux loss
    per micro-batch: moe_parity.reference_loss), AdamW stepped by WarmupLR."""
    from deepspeed.runtime.lr_schedules import WarmupLR

    from ds_hetero.families import adapter_for
    from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe

    model = tiny_qwen3_vl_moe(seed=7)
    adapter = adapter_for(model)
    opt = make_optimizer(list(model.parameters()))
    scheduler = WarmupLR(opt, **WARMUP)
    losses, auxes, norms = [], [], []
    for samples in batches:
        loss, aux = reference_loss(model, adapter, samples, micro_batches)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], CLIP)))
        opt.step()
        scheduler.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        auxes.append(aux)
    return losses, auxes, norms, {n: p.detach() for n, p in model.named_parameters()}


def _wrong_slot(param):
    return (param.ep_rank + 1) % param.ep_size


def checkpoint_chain(rank, world_size, tmp):
    from ds_hetero.checkpoint import CheckpointError
    from ds_hetero.checkpoint import reshard
    from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe

    batches = make_batches(tiny_qwen3_vl_moe(seed=7), 3 * K, 8)
    segments = [batches[i * K:(i + 1) * K] for i in range(3)]
    ckpt2, ckpt1 = os.path.join(tmp, "ep2"), os.path.join(tmp, "ep1")
    out = {"losses": [], "aux": [], "norms": []}

    def record(engine, part):
        for key, values in zip(("losses", "aux", "norms"), _train(engine, part)):
            out[key] += values

    engine = _engine(EP2, 7)
    record(engine, segments[0])
    engine.save_checkpoint(ckpt2)
    live = full_named_parameters(engine)
    engine.groups.destroy()
    if rank == 0:  # `ds-hetero checkpoint convert --to-hf` of the ep2 checkpoint: its files alone
        from transformers import Qwen3VLMoeForConditionalGeneration

        from ds_hetero.checkpoint.hf_convert import convert_to_hf

        convert_to_hf(ckpt2, os.path.join(tmp, "ep2_hf"))
        converted = Qwen3VLMoeForConditionalGeneration.from_pretrained(os.path.join(tmp, "ep2_hf"))
        out["converted"] = max_rel_err(live, dict(converted.named_parameters()))
    for spec, source, part in ((EP1, ckpt2, 1), (EP4, ckpt1, 2)):
        engine = _engine(spec, 99)  # other initial weights: the checkpoint must replace them
        engine.load_checkpoint(source)
        out.setdefault("steps_after_load", []).append(engine.global_steps)
        record(engine, segments[part])
        if spec is EP1:
            engine.save_checkpoint(ckpt1)
        else:
            out["final"] = full_named_parameters(engine)
        engine.groups.destroy()

    # negative control: ep1 -> ep4 with every rank's experts read from the next ep slot
    original = reshard.expert_slot
    reshard.expert_slot = _wrong_slot
    try:
        engine = _engine(EP4, 99)
        engine.load_checkpoint(ckpt1)
    finally:
        reshard.expert_slot = original
    wrong = _train(engine, segments[2])
    out["wrong_slot"] = {"losses": wrong[0], "final": full_named_parameters(engine)}
    engine.groups.destroy()

    # negative control: the ep2 checkpoint's expert files swapped -> refused on every rank, nothing changed
    swapped = os.path.join(tmp, "swapped")
    if rank == 0:
        shutil.copytree(ckpt2, swapped, ignore=shutil.ignore_patterns("full_state"))  # not the ep1 load's cache
        folder = os.path.join(swapped, "global_step2", "language", "ep_state")
        a, b = (os.path.join(folder, f"experts_ep0{r}.pt") for r in (0, 1))
        os.replace(a, a + ".tmp"), os.replace(b, a), os.replace(a + ".tmp", b)
    torch.distributed.barrier()
    engine = _engine(EP2, 99)
    before = full_named_parameters(engine)
    try:
        engine.load_checkpoint(swapped)
        out["swapped_refused"] = None
    except CheckpointError as exc:
        out["swapped_refused"] = str(exc)
    after = full_named_parameters(engine)
    out["swapped_unchanged"] = bool(before) and all(before[n].equal(after[n]) for n in before)
    # the same engine, after the refusal: the real ep2 checkpoint into ep2 (the same layout) continues too
    engine.load_checkpoint(ckpt2)
    out["same_layout"] = _train(engine, segments[1])[0]
    engine.groups.destroy()
    out["final"] = {n: t.numpy() for n, t in out["final"].items()}  # numpy: see test_checkpoint_layouts._portable
    out["wrong_slot"]["final"] = {n: t.numpy() for n, t in out["wrong_slot"]["final"].items()}
    return out



def disaggregated_chain(rank, world_size, tmp):
    """K steps disaggregated (vision ranks 0-1, language ep2 on 2-3), save; load colocated ep2, K steps,
    save; load disaggregated again, K steps: every loss of the 3K steps and the last engine's weights,
    for `judge` against the uninterrupted single-process run."""
    return layout_chain(rank, world_size, tmp, (EPD, EP2, EPD), "disaggregated")


def pipelined_chain(rank, world_size, tmp):
    """The same through a pipelined ep stage: pp2 dp2 ep2 ZeRO 1 (each chunk its own files), save; colocated
    tp2 dp2 ep2, save; pp2 dp2 ep2 ZeRO 2, 2 micro-batches each. Negative control: the last load with every
    rank's experts read from the other ep slot (reshard.py `expert_slot`) must miss the bar."""
    from ds_hetero.checkpoint import reshard

    out = layout_chain(rank, world_size, tmp, (EPP, EP2M2, EPP_Z2), "pipelined")
    _misloaded_last_segment(out, tmp, EPP_Z2, "pipelined_1", reshard, "expert_slot", _wrong_slot)
    return out


def zero3_chain(rank, world_size, tmp):
    """ZeRO 3 on the ep stage: pp2 dp2 ep2 ZeRO 3, save; colocated tp2 dp2 ep2 ZeRO 1, save; pp2 dp2 ep2
    ZeRO 3, 2 micro-batches each. Negative control, before the last segment: the ZeRO 1 checkpoint loaded
    into pp2 dp2 ep2 ZeRO 3 leaving the model's partitions as they were (the master weights and moments
    set, as DeepSpeed's `set_full_hp_param` alone does) must miss the bar.
    Its ZeRO 3 engines are all pipelined, and no ZeRO 3 engine without a pipeline may follow them in the
    same process: DeepSpeed numbers ZeRO 3 modules (`ds_id`) from a process-wide counter, which a chunk
    engine advances differently on each pipeline stage, and a later engine without a pipeline checks
    those numbers over the whole world (a test's several engines in one process; a resumed run is one).
    The same chain with dp4 ep2 ZeRO 3 for the first segment and the control passed when run alone."""
    from ds_hetero.checkpoint import zero3_state

    def control(out):
        _misloaded_last_segment(out, tmp, EPP_Z3, "zero3_1", zero3_state, "set_model_partition",
                                lambda param, values: None)

    return layout_chain(rank, world_size, tmp, (EPP_Z3, EP2M2, EPP_Z3), "zero3", before_last=control)


def _misloaded_last_segment(out, tmp, spec, checkpoint, module, name, wrong):
    """A chain's negative control: `spec` loads `checkpoint` with `module.name` replaced by `wrong`, then trains
    the last segment; out["wrong_slot"] gets the chain's losses with that segment's and the final weights."""
    original = getattr(module, name)
    setattr(module, name, wrong)
    try:
        engine = _engine(spec, 99)
        engine.load_checkpoint(os.path.join(tmp, checkpoint))
    finally:
        setattr(module, name, original)
    losses = _train(engine, make_batches(_tiny(), 3 * K, 8)[2 * K:])[0]
    out["wrong_slot"] = {"losses": out["losses"][:2 * K] + losses,
                         "final": {n: t.numpy() for n, t in full_named_parameters(engine).items()}}
    engine.groups.destroy()


def layout_chain(rank, world_size, tmp, specs, name, before_last=None):
    """K steps in each layout of `specs`, each loading the checkpoint the one before saved
    (`before_last(out)` runs before the last segment: a control)."""
    from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe

    batches = make_batches(tiny_qwen3_vl_moe(seed=7), 3 * K, 8)
    out = {"losses": [], "aux": [], "norms": [], "micro_batches": specs[0].get("micro_batches", 1)}
    source = None
    for i, spec in enumerate(specs):
        if i == len(specs) - 1 and before_last is not None:
            before_last(out)
        engine = _engine(spec, 7 if i == 0 else 99)
        if source is not None:
            engine.load_checkpoint(source)
        for key, values in zip(("losses", "aux", "norms"), _train(engine, batches[i * K:(i + 1) * K])):
            out[key] += values
        if i < 2:
            source = os.path.join(tmp, f"{name}_{i}")
            engine.save_checkpoint(source)
        else:
            out["final"] = {n: t.numpy() for n, t in full_named_parameters(engine).items()}
        engine.groups.destroy()
    return out

def judge(r, reference, rtol=1e-5):
    """(worst loss, aux, norm relative error over the steps, the weights' max_rel_err) of a run."""
    losses, auxes, norms, weights = reference
    rel = lambda got, want: max(abs(g - w) / abs(w) for g, w in zip(got, want, strict=True))  # noqa: E731
    final = {n: torch.from_numpy(v) for n, v in r["final"].items()}
    return rel(r["losses"], losses), rel(r["aux"], auxes), rel(r["norms"], norms), max_rel_err(final, weights)



def check_chain(results, rtol, atol):
    """The chain's assertions (tests/parallel/test_expert_parallel.py): every loss, aux loss and norm of
    the uninterrupted single-process run, and its final weights; the same-layout resume; convert --to-hf;
    experts from the wrong ep slot miss the bar; swapped expert files are refused on every rank, nothing changed."""
    reference = reference_run(make_batches(_tiny(), 3 * K, 8))
    assert min(reference[2]) > CLIP  # clipping active
    for r in results:
        assert r["steps_after_load"] == [K, 2 * K]
        losses, aux, norms, (err, where, abs_err, compared) = judge(r, reference)
        assert losses <= rtol and aux <= rtol and norms <= 1e-4, (losses, aux, norms)
        assert compared == 93 and err <= rtol and abs_err <= atol, (err, where, abs_err)
        wrong = judge(dict(r, losses=r["losses"][:2 * K] + r["wrong_slot"]["losses"], final=r["wrong_slot"]["final"]),
                      reference)
        assert wrong[0] > 10 * rtol and wrong[3][0] > 1e-2, wrong
        assert r["swapped_refused"] is not None and r["swapped_unchanged"], r["swapped_refused"]
        assert max(abs(g - w) / abs(w) for g, w in zip(r["same_layout"], reference[0][K:2 * K], strict=True)) <= rtol
    assert "experts in the wrong ep slot" in results[0]["swapped_refused"]
    err, where, _, compared = results[0]["converted"]  # convert --to-hf from the ep2 files
    assert compared == 93 and err == 0.0, (err, where)


def check_disaggregated_chain(results, rtol, atol):
    """disaggregated -> colocated -> disaggregated at ep2 (or pipelined -> colocated -> pipelined with
    another cut): the single-process run's every loss, aux loss and norm, and the final weights of the
    stages each rank holds (colocated then: all of them; pipelined: its chunk's)."""
    reference = reference_run(make_batches(_tiny(), 3 * K, 8), results[0]["micro_batches"])
    for r in results:
        losses, aux, norms, (err, where, abs_err, compared) = judge(r, reference)
        assert losses <= rtol and aux <= rtol and norms <= 1e-4, (losses, aux, norms)
        assert compared > 0 and err <= rtol and abs_err <= atol, (err, where, abs_err)
        if "wrong_slot" in r:  # the pipelined and ZeRO 3 chains' controls
            wrong = judge(dict(r, **r["wrong_slot"]), reference)
            assert wrong[0] > 10 * rtol and wrong[3][0] > 1e-2, wrong


def _tiny():
    from ds_hetero.families.qwen3_vl_moe import tiny_qwen3_vl_moe

    return tiny_qwen3_vl_moe(seed=7)
