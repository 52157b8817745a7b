"""The planner without processes: shapes, FLOPs and bytes against hand counts, the alpha-beta model,
memory per ZeRO stage, the enumeration (count and validity), ranking, `ds-hetero plan --write`."""

import json

import pytest

from ds_hetero.errors import HeteroConfigError
from ds_hetero.planner.candidate import Candidate, StageChoice
from ds_hetero.planner.collectives import dp_collectives, language_collectives, vision_collectives
from ds_hetero.planner.flops import language_work, vision_work
from ds_hetero.planner.machine import PROFILES
from ds_hetero.planner.memory import state_elements
from ds_hetero.planner.model_spec import model_spec
from ds_hetero.planner.workload import Workload

BASE = {"train_batch_size": 16, "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}


@pytest.fixture(scope="module")
def llava():
    from ds_hetero.toy import tiny_llava

    return tiny_llava()  # text 64 x 2 layers, 4 heads / 2 kv, ffn 128, vocab 256; CLIP 32 x 2, 4 heads, 32px/8


@pytest.fixture(scope="module")
def spec(llava):
    return model_spec(llava.config)


def test_parameter_counts_match_the_models():
    from ds_hetero.families.llava.adapter import split_llava
    from ds_hetero.families.qwen2_vl.adapter import split_qwen2_vl
    from ds_hetero.toy import tiny_llava, tiny_qwen2_vl

    checked = 0
    for model, split in ((tiny_llava(), split_llava), (tiny_llava("siglip"), split_llava),
                         (tiny_qwen2_vl(), split_qwen2_vl), (tiny_llava(tie_word_embeddings=True), split_llava),
                         (tiny_qwen2_vl(tie_word_embeddings=True), split_qwen2_vl)):
        s, stages = model_spec(model.config), split(model)
        v = stages["vision"]
        vparams = v.trainable_parameters() if hasattr(v, "trainable_parameters") else list(v.parameters())
        assert s.vision.params() == sum(p.numel() for p in vparams)
        assert s.language.params() == sum(p.numel() for p in stages["language"].parameters())  # a tie once
        tied = model.lm_head.weight is model.get_input_embeddings().weight
        assert s.language.tied == tied
        # tp 2: the vocabulary matrices split on rows like the layers' weights (here all even)
        lm = s.language
        assert s.params_per_rank("language", 2) == (lm.params() - lm.replicated_params()) // 2 + lm.replicated_params()
        checked += 1
    assert checked == 5


def test_language_flops_hand_count(spec):
    wl = Workload(seq_len=32, image_tokens=16, global_batch=1, dtype_bytes=4)
    s, h, kv, f, v, heads, hd = 32, 64, 2 * 16, 128, 256, 4, 16
    per_layer = (2 * s * h * h  # q
                 + 2 * 2 * s * h * kv  # k, v (2 kv heads x 16)
                 + 2 * s * h * h  # o
                 + 2 * s * h * 2 * f + 2 * s * f * h  # gate + up, down
                 + 2 * heads * 2 * s * hd * s)  # scores and probabilities x values, full matrix
    forward = 2 * per_layer + 2 * s * h * v  # 2 layers + head
    work = language_work(spec, wl, samples=1, tp=1, cp=1, causal=1.0)
    assert work.forward_flops == forward == 6291456
    assert work.flops == 3 * forward
    # tp 2 halves every GEMM here (every width is even), causal 0.5 halves attention
    assert language_work(spec, wl, 1, 2, 1, 1.0).flops * 2 == work.flops
    half = language_work(spec, wl, 1, 1, 1, 0.5).forward_flops
    attention = 2 * heads * 2 * s * hd * s  # per layer
    assert forward - half == 2 * attention // 2  # 2 layers, half of each


def test_vision_flops_hand_count(spec):
    wl = Workload(seq_len=32, image_tokens=16, global_batch=1, dtype_bytes=4)
    n, h, f, heads, hd, k, th = 17, 32, 64, 4, 8, 16, 64  # 16 patches + CLS
    layer = 2 * n * h * 3 * h + 2 * n * h * h + 2 * n * h * f + 2 * n * f * h + 2 * heads * 2 * n * hd * n
    patch = 2 * 16 * 192 * h  # 3 x 8 x 8 inputs per patch, no gradient to the pixels
    projector = 2 * k * h * th + 2 * k * th * th
    # feature layer -2: the forward runs both layers, the gradient reaches the first only
    expected = 2 * patch + 3 * layer + 1 * layer + 3 * projector
    assert vision_work(spec, wl, samples=1, tp=1).flops == expected == 2245120


def test_collective_bytes_hand_count(spec):
    wl = Workload(seq_len=32, image_tokens=16, global_batch=8, dtype_bytes=4, zero=1)
    colls = language_collectives(spec, wl, samples=1, layout=StageChoice(tp=2, dp=2))
    tp = [c for c in colls if c.axis == "tp"]
    act = 32 * 64 * 4
    assert [(c.kind, c.nbytes, c.count) for c in tp] == [("all_reduce", act, 4 * 2 + 2), ("all_reduce", 32 * 4, 3)]
    dp = [c for c in colls if c.axis == "dp"]
    held = spec.params_per_rank("language", 2)
    assert [(c.kind, c.nbytes, c.per) for c in dp] == [("reduce_scatter", held * 4, "step"),
                                                        ("all_gather", held * 4, "step")]
    # sequence parallelism: each all-reduce becomes an all-gather and a reduce-scatter of the same tensor
    sp = [c for c in language_collectives(spec, wl, 1, StageChoice(tp=2, dp=2, sequence_parallel=True))
          if c.axis == "tp" and c.nbytes == act]
    assert sorted(c.kind for c in sp) == ["all_gather", "reduce_scatter"] and all(c.count == 10 for c in sp)
    # Ulysses cp 2: q, k, v, out all-to-alls forward and backward per layer, over 16 local tokens
    cp = [c for c in language_collectives(spec, wl, 1, StageChoice(tp=1, cp=2, dp=1)) if c.axis == "cp"]
    assert [c.nbytes for c in cp] == [16 * 64 * 4, 16 * 32 * 4, 16 * 32 * 4, 16 * 64 * 4]
    assert all(c.kind == "all_to_all" and c.count == 4 and c.group == 2 for c in cp)
    # vision tp 2: 2 regions per layer forward (2 layers) and backward (1 layer), the projector's 2
    v = [c for c in vision_collectives(spec, wl, 1, StageChoice(tp=2, dp=1)) if c.axis == "tp"]
    assert [(c.nbytes, c.count) for c in v] == [(17 * 32 * 4, 2 * 2 + 2 * 1), (16 * 64 * 4, 2)]
    # ZeRO stages
    one = StageChoice(tp=1, dp=4)
    assert [(c.kind, c.per, c.count) for c in dp_collectives(100, Workload(1, 0, 4, 4, 0), one)] == [
        ("all_reduce", "step", 1)]
    assert [(c.kind, c.per, c.count) for c in dp_collectives(100, Workload(1, 0, 4, 4, 3), one)] == [
        ("reduce_scatter", "micro_batch", 1), ("all_gather", "micro_batch", 2)]
    assert dp_collectives(100, Workload(1, 0, 4, 4, 1), StageChoice(tp=4, dp=1)) == []


def test_alpha_beta_model():
    m = PROFILES["h100"]
    nbytes = 1 << 30
    # one call's latency (NCCL's base latency) plus the ring's steps and bytes
    ring = 2 * 7 * m.alpha_intra + 2 * 7 / 8 * nbytes / m.intra_bw
    assert m.call_latency > 0
    assert m.collective_time("all_reduce", nbytes, 8) == pytest.approx(m.call_latency + ring)
    assert m.collective_time("all_gather", nbytes, 8) == pytest.approx(m.call_latency + ring / 2)
    # a tiny all-reduce costs its latency, not its bytes
    assert m.collective_time("all_reduce", 64, 4) == pytest.approx(m.call_latency + 6 * m.alpha_intra, rel=1e-3)
    # a group spanning two nodes runs at the network's bandwidth
    assert m.collective_time("all_reduce", nbytes, 16) > 5 * m.collective_time("all_reduce", nbytes, 8)
    assert m.collective_time("all_reduce", nbytes, 1) == 0.0
    fitted = m.with_calibration(collectives={"all_reduce": {2: (1e-3, 1e-9), 4: (3e-3, 2e-9)}})
    assert fitted.collective_time("all_reduce", 1000, 4) == pytest.approx(3e-3 + 2e-6)


def test_model_state_elements_per_zero_stage():
    layout = StageChoice(tp=1, dp=4)
    # ZeRO shards over every rank holding the same tp shard: cp x dp ranks count as dp ranks do;
    # without ZeRO every rank holds everything, whatever the dp degree
    assert state_elements(1000, StageChoice(tp=1, cp=2, dp=2), 1) == state_elements(1000, layout, 1)
    assert state_elements(1000, StageChoice(tp=1, dp=1), 0) == state_elements(1000, layout, 0)
    z = {stage: state_elements(1000, layout, stage) for stage in range(4)}
    assert (z[0].params, z[0].grads, z[0].master, z[0].moments) == (1000, 1000, 0, 2000)
    assert (z[1].params, z[1].grads, z[1].master, z[1].moments) == (1000, 1000, 250, 500)
    assert (z[2].params, z[2].grads, z[2].master, z[2].moments) == (1000, 250, 250, 500)
    assert (z[3].params, z[3].grads, z[3].master, z[3].moments) == (250, 250, 250, 500)
    assert z[3].bytes(2) < z[2].bytes(2) < z[1].bytes(2) < z[0].bytes(2)


def test_optimizer_transient_sets_the_peak_of_a_wide_vocabulary():
    """Qwen2-VL-2B's widths (ds_configs/planner/qwen2vl_2b_2layers.json), fp32, vision dp2 + language
    tp2: the peak is the states plus torch AdamW's two copies of the language's flat master partition
    (measured in benchmarks/plan_real_width.py), not plus the activations."""
    from dataclasses import replace

    from ds_hetero.planner.memory import RankMemory, optimizer_transient, peak_memory, rank_peak
    from ds_hetero.planner.model_source import load_hf_config

    wide = model_spec(load_hf_config("ds_configs/planner/qwen2vl_2b_2layers.json"))
    cand = Candidate("colocated", StageChoice(1, 2), StageChoice(2, 1), 1)
    plain, torch_adam = (Workload(seq_len=256, image_tokens=64, global_batch=2, dtype_bytes=4, torch_adam=t)
                         for t in (False, True))
    master = wide.params_per_rank("language", 2)  # dp 1: the whole tp shard is the master partition
    vocab_shard = 151936 // 2 * 1536
    assert optimizer_transient(vocab_shard, master, 1, True) == 8 * master  # sqrt and the division
    assert optimizer_transient(vocab_shard, master, 1, False) == 8 * vocab_shard  # the norm's float64 copy
    assert optimizer_transient(vocab_shard, master, 3, True) == 0
    gap = peak_memory(wide, torch_adam, cand, False)["all"] - peak_memory(wide, plain, cand, False)["all"]
    assert gap == pytest.approx(8 * master - 8 * vocab_shard)
    # negative control: a transient below the activations leaves the peak where the backward puts it
    assert rank_peak([RankMemory(10.0, 5.0, 3.0), RankMemory(1.0, 1.0, 4.0)]) == 17.0
    assert rank_peak([RankMemory(10.0, 5.0, 3.0), RankMemory(1.0, 1.0, 9.0)]) == 20.0
    # a CPU's heap keeps the freed activations under the transient; one engine steps both partitions
    assert rank_peak([RankMemory(10.0, 5.0, 3.0), RankMemory(1.0, 1.0, 9.0)], heap_keeps_activations=True) == 26.0
    assert rank_peak([RankMemory(10.0, 5.0, 8.0, 8.0), RankMemory(1.0, 1.0, 4.0, 4.0)], one_engine=True) == 23.0
    from ds_hetero.planner.memory import language_memory, one_engine, vision_memory

    both = Candidate("colocated", StageChoice(2, 1), StageChoice(2, 1), 1)  # equal layouts: one engine
    assert one_engine(wide, torch_adam, both) and not one_engine(wide, torch_adam, cand)
    assert not one_engine(wide, replace(torch_adam, zero=2), both)  # ZeRO 2 keeps an engine per stage
    stages = [language_memory(wide, torch_adam, both, False, 0, 1), vision_memory(wide, torch_adam, both, False, 1)]
    shared = peak_memory(wide, torch_adam, both, False)["all"]
    assert shared == pytest.approx(rank_peak(stages, one_engine=True)) and shared > rank_peak(stages)


def test_cpu_optimizer_and_first_touch_terms(spec):
    """torch's unfused AdamW costs 96 bytes per master element, a fused Adam 36 (both with the fp64
    norm's 20 per gradient); a machine that first-touches memory pays for the pages a step maps fresh,
    its own breakdown part; negative control: the GPU profiles (caching allocator) pay none."""
    from dataclasses import replace

    from ds_hetero.planner.cost import first_touch_bytes, stage_times
    from ds_hetero.planner.memory import state_elements

    cpu = PROFILES["cpu"]
    layout = StageChoice(tp=1, dp=2)
    fused, torch_adam = (Workload(seq_len=96, image_tokens=16, global_batch=4, dtype_bytes=4, torch_adam=t)
                         for t in (False, True))
    master = state_elements(spec.params_per_rank("language", 1), layout, 1).master
    t_fused = stage_times(spec, fused, cpu, "language", layout, 1)[1]["optimizer"]
    t_torch = stage_times(spec, torch_adam, cpu, "language", layout, 1)[1]["optimizer"]
    assert t_torch - t_fused == pytest.approx((96 - 36) * master / cpu.memory_bw)
    assert t_fused == pytest.approx((36 + 20) * master / cpu.memory_bw)
    touching = replace(cpu, first_touch=1e-9)
    parts = stage_times(spec, torch_adam, touching, "language", layout, 1)[1]
    st = state_elements(spec.params_per_rank("language", 1), layout, 1)
    assert parts["first touch"] > touching.first_touch * first_touch_bytes(st, 0.0, 1, torch_adam) > 0
    assert parts["optimizer"] == pytest.approx(t_torch)
    assert "first touch" in stage_times(spec, torch_adam, cpu, "language", layout, 1)[1]
    assert stage_times(spec, torch_adam, cpu, "language", layout, 1)[1]["first touch"] == 0.0
    assert all(PROFILES[name].first_touch == 0.0 for name in ("h100", "h200", "a100"))


def _plan(**kw):
    from ds_hetero.planner import machine_profile, plan

    kw.setdefault("modelled", False)
    return plan("tiny-llava", kw.pop("world", 4), kw.pop("seq_len", 96), kw.pop("image_tokens", 16),
                kw.pop("global_batch", 16), machine_profile("cpu"), base=kw.pop("base", BASE), **kw)


def test_enumeration_count_and_every_row_valid(tmp_path, llava):
    """Hand count for tiny LLaVA (vision tp 1/2/4 divide its 4 heads; language tp 1/2: 2 kv heads), 4 ranks,
    batch 16: colocated (vision dp, language dp) pairs (4,4) (4,2) (2,4) (1,4) allow mb 1/2/4, (2,2) (1,2)
    also 8: 4 x 3 + 2 x 4 = 20; disaggregated 2+2 (dp 2 or 1 each side): 3 pairs x 4 mb + (1,1) x 5 = 17;
    splits 1+3 and 3+1 need a dp of 3, which does not divide 16. Total 37 without sequence sharding.
    With it (the language stage's cp x tp sequence shards; heads 4 divide tp x cp, kv heads repeated at
    cp 4): colocated language (tp,cp,dp) 1,2,2 / 1,4,1 / 2,1,2 sp / 2,2,1 / 2,2,1 sp against vision dp 4,
    2, 1, micro-batches the powers of two up to 16 / max(dp): vision dp4 5 x 3, dp2 5 x 4, dp1 2 x 4 +
    3 x 5 = 58; disaggregated 2+2, language cp2 or tp2 sp (dp 1), vision dp2 (4 mb) or tp2 (5 mb): 18.
    Total 37 + 76 = 113 with one encoder pass per micro-batch.
    Fewer encoder passes (colocated, unsharded language only: the config refuses them with cp or sp),
    p a proper divisor of mb with 16 divisible by vision dp x p: vision dp 4 or 2 or 1 at mb 1/2/4 give
    0 + 1 + 2, at mb 8 (vision dp 2 or 1) 3 more: pairs (4,4) (4,2) (2,4) (1,4) 3 each, (2,2) (1,2) 6
    each = 24; and (4,2) at mb 8, whose one-pass-per-micro-batch form is refused (vision dp 4 x 8 > 16),
    with 1, 2 or 4 passes: 3 more, 27. Total 140 under the rules above.
    Since an encoder may have more dp ranks than a pass has samples and a dp that does not divide the
    pass (balance "tokens": images, not samples, are its unit), and fewer encoder passes are accepted
    with a sharded language sequence, the engine's checks accept more: unsharded one-pass rows gain
    vision dp4 with language tp2 dp2 at mb 8 (colocated, 21), the 3+1 split vision dp3 + language dp1
    at mb 1/2/4/8/16 and vision dp2 + language tp2 at mb 16 (disaggregated, 23); the sharded one-pass
    rows gain the same kind (69 colocated, 20 disaggregated), and fewer passes now come with sharded
    language stages too (126). Total 286."""
    from ds_hetero.cli import main
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.planner.validity import check_candidate
    from ds_hetero.families import adapter_for

    p = _plan()
    assert all(x.runnable for x in p.predictions)
    fewer = [c for c in p.predictions if c.candidate.passes < c.candidate.micro_batches]
    sharded = [c for c in p.predictions if c.candidate.language.cp > 1 or c.candidate.language.sequence_parallel]
    unsharded = [c for c in p.predictions if c not in sharded and c not in fewer]
    one_pass_sharded = [c for c in sharded if c not in fewer]
    assert len(unsharded) == 44 and len(one_pass_sharded) == 89 and len(fewer) == 27 + 126
    assert not any(c.candidate.disaggregated for c in fewer)
    assert sum(c not in sharded for c in fewer) == 27  # the unsharded fewer-pass rows of the count above
    assert sum(not c.candidate.disaggregated for c in unsharded) == 21
    assert sum(not c.candidate.disaggregated for c in one_pass_sharded) == 69
    beyond = {c.candidate.label() for c in unsharded
              if 16 % (c.candidate.vision.dp * c.candidate.micro_batches)}  # the tokens-balance additions
    assert beyond == {f"V tp1dp3@3, L tp1dp1@1 mb{m}" for m in (1, 2, 4, 8, 16)} | {
        "V tp1dp2@2, L tp2dp1@2 mb16", "V tp1dp4 L tp2dp2 mb8"}, beyond
    assert p.stats["rejected"] == p.stats["generated"] - 286 > 0
    labels = {pred.candidate.label() for pred in p.predictions}
    assert len(labels) == 286
    for i, pred in enumerate(p.predictions):  # every row: `ds-hetero validate` accepts its DS JSON
        path = tmp_path / f"c{i}.json"
        path.write_text(json.dumps(pred.candidate.ds_config(p.base)))
        assert main(["validate", str(path), "--world-size", "4"]) == 0
    # negative control: the language at tp 4 (tiny LLaVA has 2 kv heads) is rejected by the same checks
    bad = Candidate("colocated", StageChoice(1, 4), StageChoice(4, 1), 1)
    assert "V tp1dp4 L tp4dp1 mb1" not in labels
    with pytest.raises(HeteroConfigError, match="language.tp"):
        check_candidate(bad.ds_config(p.base), 4, adapter_for(llava))


def test_a_sequence_length_the_shards_do_not_divide_is_planned_padded():
    """The engine pads a sequence to a multiple of the language shards; so does the boundary cost."""
    p = _plan(seq_len=81)
    assert len(p.predictions) == 286
    assert any(x.candidate.language.cp == 2 and x.boundary_bytes > 0 for x in p.predictions)


def test_sequence_sharding_switch_follows_validation(monkeypatch, llava):
    """cp > 1 appears in the enumeration as soon as the engine's checks accept it."""
    import ds_hetero.validation as engine
    from ds_hetero.families import adapter_for
    from ds_hetero.planner.enumerate import sequence_sharding

    adapter = adapter_for(llava)
    before = sequence_sharding(BASE, adapter)
    original = engine.check_engine_support

    def accept_cp(cfg, has_client_optimizer=False):
        if cfg.language.cp > 1:
            return
        original(cfg, has_client_optimizer)

    def reject_cp(cfg, has_client_optimizer=False):
        if cfg.language.cp > 1:
            raise HeteroConfigError("hetero_parallel.stages.language.cp", "refused by this test")
        original(cfg, has_client_optimizer)

    monkeypatch.setattr(engine, "check_engine_support", accept_cp)
    assert sequence_sharding(BASE, adapter)[0] is True
    assert before[0] is True  # the engine's checks accept cp > 1 today (context_parallel/)
    p = _plan(placements=("colocated",))
    assert any(pred.candidate.language.cp == 2 for pred in p.predictions)
    # the control: checks that refuse cp > 1 take it out of the enumeration
    monkeypatch.setattr(engine, "check_engine_support", reject_cp)
    assert sequence_sharding(BASE, adapter)[0] is False
    assert not any(pred.candidate.language.cp > 1 for pred in _plan(placements=("colocated",)).predictions)


def test_ranking_and_predictions(tmp_path):
    p = _plan()
    steps = [x.step_s for x in p.predictions]
    assert steps == sorted(steps) and all(s > 0 for s in steps)
    best = p.best
    assert best.tokens_per_s == pytest.approx(16 * 96 / best.step_s)
    assert all(v > 0 for v in best.peak_memory.values())
    assert p.best_homogeneous() is not None and p.best_homogeneous().candidate.homogeneous
    # a memory limit below every candidate's peak marks every row as not fitting
    tight = _plan(memory_gb=1e-6)
    assert not any(x.fits for x in tight.predictions)


def test_plan_cli_writes_a_valid_config(tmp_path, capsys):
    from ds_hetero.cli import main

    out = tmp_path / "planned.json"
    assert main(["plan", "--model", "tiny-qwen2-vl", "--world-size", "4", "--seq-len", "64", "--image-tokens", "16",
                 "--global-batch", "8", "--machine", "h100", "--top", "5", "--write", str(out)]) == 0
    text = capsys.readouterr().out
    assert "TFLOPS/dev" in text and "compute" in text and "wrote" in text
    # both baselines, labelled, and which rows the engine runs today
    assert "today's baseline" in text and "Megatron baseline, tuned" in text and "modelled" in text
    assert "vs the tuned Megatron baseline" in text and "runnable pick" in text
    cfg = json.loads(out.read_text())
    assert cfg["train_batch_size"] == 8 and "hetero_parallel" in cfg
    assert main(["validate", str(out), "--world-size", "4"]) == 0
    # the encoder's tokens may exceed the sequence (2x2 merge: 64 encoder tokens give the language 16)
    assert main(["plan", "--model", "tiny-qwen2-vl", "--world-size", "2", "--seq-len", "32", "--encoder-tokens",
                 "64", "--global-batch", "4", "--no-modelled", "--top", "2"]) == 0
    assert "image tokens 16 (the encoder sees 64)" in capsys.readouterr().out
    # an image-token count that is no multiple of LLaVA's tokens per image is refused clearly
    assert main(["plan", "--model", "tiny-llava", "--world-size", "4", "--seq-len", "64", "--image-tokens", "10",
                 "--global-batch", "8"]) == 1
    assert "multiple of 16" in capsys.readouterr().err


def test_boundary_rows_come_from_the_plan():
    from ds_hetero.config import parse_config
    from ds_hetero.planner.boundary_cost import boundary_rows

    def cfg(v, lang):
        return parse_config({"train_batch_size": 16, "hetero_parallel": {"stages": {
            "vision": v, "language": lang}}}, 4)

    # identical layouts colocated: every row is already where it is needed
    assert boundary_rows(cfg({"tp": 2, "dp": 2}, {"tp": 2, "dp": 2}), 16, 64) == (0, 0)
    # vision dp4 -> language tp2 dp2: each row has 2 destination copies, one of which is local
    assert boundary_rows(cfg({"tp": 1, "dp": 4}, {"tp": 2, "dp": 2}), 16, 64) == (16 * 16, 0)
    # the scaled-down plan of a large micro-batch gives the same count as the full one
    from ds_hetero.planner import boundary_cost

    full = boundary_rows(cfg({"tp": 1, "dp": 4}, {"tp": 1, "dp": 4}), 2048, 4096)
    boundary_cost.exchange_rows.cache_clear()
    old, boundary_cost.MAX_ROWS = boundary_cost.MAX_ROWS, 10**9
    try:
        assert boundary_rows(cfg({"tp": 1, "dp": 4}, {"tp": 1, "dp": 4}), 2048, 4096) == full
    finally:
        boundary_cost.MAX_ROWS = old
        boundary_cost.exchange_rows.cache_clear()


def test_validate_accepts_auto_and_rejects_bad_auto_keys(tmp_path, capsys):
    from ds_hetero.cli import main

    good, bad = tmp_path / "auto.json", tmp_path / "bad.json"
    good.write_text(json.dumps(dict(BASE, hetero_parallel={"auto": True, "seq_len": 96})))
    bad.write_text(json.dumps(dict(BASE, hetero_parallel={"auto": True, "seqlen": 96})))
    assert main(["validate", str(good), "--world-size", "4"]) == 0
    assert main(["validate", str(bad), "--world-size", "4"]) == 1
    assert "hetero_parallel.seqlen" in capsys.readouterr().err
