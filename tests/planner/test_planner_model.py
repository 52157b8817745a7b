"""The cost model's newer terms against hand counts (no processes): SwiGLU / GQA activations, sequence
parallel element-wise bytes, boundary exchanges that move nothing, encoder vs language image tokens,
disaggregated batches, 1F1B pipelines, micro-batches in flight, the Megatron baseline."""

import pytest

from ds_hetero.planner.activations import language_activation_bytes, language_layer_elements
from ds_hetero.planner.candidate import Candidate, StageChoice
from ds_hetero.planner.machine import PROFILES
from ds_hetero.planner.model_spec import model_spec
from ds_hetero.planner.step_time import StageTimes, colocated_pipeline_step, first_stage_step, one_f_one_b
from ds_hetero.planner.workload import Workload, image_tokens_of

LLAMA70 = {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
           "num_hidden_layers": 80, "vocab_size": 32000, "model_type": "llama"}


def _spec70():
    vision = {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
              "num_attention_heads": 16, "num_hidden_layers": 24, "image_size": 336, "patch_size": 14}
    return model_spec({"model_type": "llava", "vision_config": vision, "text_config": LLAMA70})


def test_swiglu_gqa_activations_hand_count():
    spec = _spec70()
    h, q, kv, f = 8192, 8192, 8 * 128, 28672
    # norm inputs and outputs 4h; q, k, v 1 q + 2 kv; attention output q; SwiGLU gate, up, silu, product 4f
    per_token = 4 * h + 2 * q + 2 * kv + 4 * f
    assert per_token == 165888
    assert language_layer_elements(spec, 1, False) == per_token
    # tp 8: only the split tensors shrink without sp, everything with sp
    assert language_layer_elements(spec, 8, False) == 4 * h + (2 * q + 2 * kv + 4 * f) / 8
    assert language_layer_elements(spec, 8, True) == per_token / 8
    # against the old GELU / MHA count hidden x (10 + 24 / tp) bytes at 2 bytes: 17 h elements at tp 1
    assert per_token / (17 * h) == pytest.approx(1.19, abs=0.01)
    wl = Workload(seq_len=4096, image_tokens=576, global_batch=1, dtype_bytes=2)
    one = language_activation_bytes(spec, wl, 1, 8, 1, True, True, layers=10, head=False)
    assert one == 10 * 4096 * per_token / 8 * 2
    # recompute keeps each layer's input (h / tp per token with sp) plus one whole layer
    rc = language_activation_bytes(spec, wl, 1, 8, 1, True, True, layers=10, recompute=True, head=False)
    assert rc == 10 * 4096 * h / 8 * 2 + 4096 * per_token / 8 * 2


def test_sequence_parallel_divides_hidden_elementwise_bytes():
    from ds_hetero.planner.flops import language_work

    spec = _spec70()
    wl = Workload(seq_len=1024, image_tokens=576, global_batch=1, dtype_bytes=2)
    plain = language_work(spec, wl, 1, 8, 1, 0.5, False, layers=1, head=False).elementwise_bytes
    sp = language_work(spec, wl, 1, 8, 1, 0.5, True, layers=1, head=False).elementwise_bytes
    hidden = 1024 * 8192 * 8 * 2  # norms, residuals on [tokens, hidden]: 8 passes
    assert plain - sp == pytest.approx(hidden - hidden / 8)


def test_an_exchange_that_moves_nothing_costs_only_the_consensus():
    from ds_hetero.planner.step_model import TINY, boundary_seconds

    spec = _spec70()
    m = PROFILES["h100"]
    wl = Workload(seq_len=4096, image_tokens=576, global_batch=16, dtype_bytes=2)
    same = Candidate("colocated", StageChoice(2, 4), StageChoice(2, 4), 2)
    t, nbytes = boundary_seconds(same, spec, wl, m)
    assert nbytes == 0 and t == m.collective_time("all_reduce", TINY, 8)
    moved = Candidate("colocated", StageChoice(1, 8), StageChoice(2, 4), 2)
    t2, nbytes2 = boundary_seconds(moved, spec, wl, m)
    assert nbytes2 > 0 and t2 > t + m.collective_time("all_to_all", 1, 8) - m.collective_time("all_to_all", 0, 8)
    megatron = Candidate("first_stage", StageChoice(2, 4), StageChoice(2, 4), 2)
    assert boundary_seconds(megatron, spec, wl, m) == (0.0, 0)


def test_encoder_tokens_are_not_the_language_image_tokens():
    from ds_hetero.toy import tiny_qwen2_vl

    spec = model_spec(tiny_qwen2_vl().config)  # spatial merge 2 x 2
    assert image_tokens_of(spec, None, 64) == 16
    wl = Workload(seq_len=32, image_tokens=16, global_batch=4)
    wl.check(spec)  # 64 encoder tokens, more than the sequence: fine
    assert wl.encoder_tokens(spec) == 64
    with pytest.raises(ValueError, match="--encoder-tokens 256"):
        Workload(seq_len=32, image_tokens=64, global_batch=4).check(spec)
    with pytest.raises(ValueError, match="exactly one"):
        image_tokens_of(spec, 16, 64)


def test_disaggregated_split_may_round_the_batch():
    from ds_hetero.planner import machine_profile, plan

    p = plan("tiny-llava", 4, 96, 16, 16, machine_profile("cpu"), placements=("disaggregated",), modelled=False,
             batch_slack=0.1, micro_batches=(1,))
    odd = [x for x in p.predictions if x.candidate.global_batch is not None]
    assert odd and all(x.runnable for x in odd)
    # 1 + 3 and 3 + 1 splits need a dp of 3: batch 15 (within 10% of 16), checked by the engine's config
    assert {x.candidate.global_batch for x in odd} == {15}
    assert all(x.candidate.ds_config(p.base)["train_batch_size"] == 15 for x in odd)
    assert odd[0].tokens_per_s == pytest.approx(15 * 96 / odd[0].step_s)


def test_one_f_one_b_and_placements_hand_count():
    assert one_f_one_b([1.0, 2.0], 3) == 2 * 2.0 + 3.0
    v = StageTimes(0.5, 1.0, 0.1)
    chunks = [StageTimes(1.0, 2.0, 0.2), StageTimes(1.0, 2.0, 0.3)]
    # first_stage: the encoder (1.5 per micro-batch) on stage 0: t = [4.5, 3]; 4 micro-batches
    step, _ = first_stage_step(v, chunks, 4)
    assert step == 3 * 4.5 + 7.5 + max(0.2 + 0.1, 0.3)
    # colocated encoder, 2 passes: the first forward and last backward outside, one pass in the bubble
    step, _ = colocated_pipeline_step(v, chunks, 0.0, 4, 2)
    pipe = 3 * 3.0 + 6.0
    assert step == pytest.approx(1.5 + max(pipe, 4 * 3.0 + 1.5) + 0.1 + 0.3)


def test_in_flight_micro_batches_in_memory():
    from ds_hetero.planner.memory import encoder_passes_in_flight, language_memory, peak_memory

    spec = _spec70()
    wl = Workload(seq_len=4096, image_tokens=576, global_batch=64, dtype_bytes=2)
    lang = StageChoice(8, 2, pp=4, sequence_parallel=True)
    c = Candidate("colocated", StageChoice(1, 64), lang, 8, encoder_passes=2)
    # 4 language micro-batches per pass; stage 0 holds 4 in flight: up to 2 passes
    assert encoder_passes_in_flight(c) == 2
    assert encoder_passes_in_flight(Candidate("colocated", StageChoice(1, 64), lang, 8)) == 4
    assert encoder_passes_in_flight(Candidate("colocated", StageChoice(1, 64), StageChoice(8, 8), 8, 1)) == 1
    a0 = language_memory(spec, wl, c, True, 0, 4).activations
    a3 = language_memory(spec, wl, c, True, 3, 1).activations
    assert a0 == pytest.approx(4 * (a3 - 4 * 4096 * 32000 / 8 * 4 * 2), rel=1e-9)  # stage 3 adds the logits
    meg = Candidate("first_stage", StageChoice(8, 2), StageChoice(8, 2, pp=4, sequence_parallel=True), 8)
    assert peak_memory(spec, wl, meg, True)["all"] > language_memory(spec, wl, meg, True, 0, 4).total


def test_megatron_without_pipeline_or_cp_is_todays_single_layout():
    from ds_hetero.planner import machine_profile, plan

    p = plan("tiny-llava", 4, 96, 16, 16, machine_profile("h100"), placements=("colocated",), micro_batches=(2,))
    homog = p.best_where(lambda c: c.homogeneous and c.vision.tp == 2 and c.language.dp == 2
                         and not c.language.sequence_parallel)
    meg = p.best_where(lambda c: c.megatron and c.language.tp == 2 and c.language.pp == 1 and c.language.cp == 1
                       and not c.language.recompute and not c.language.sequence_parallel)
    assert homog.runnable and meg.runnable  # first_stage with pp 1: the engine's checks accept it
    # the same work; the engine's consensus all-reduce before the (empty) exchange is the difference
    from ds_hetero.planner.step_model import TINY

    consensus = 2 * p.machine.collective_time("all_reduce", TINY, 4)
    assert homog.step_s - meg.step_s == pytest.approx(consensus, rel=1e-6)
    assert p.best_megatron() is not None and p.best_megatron().tokens_per_s >= meg.tokens_per_s


def test_flash_attention_keeps_the_scores_off_memory():
    """Flash attention (FlashAttention, Dao et al. 2022) never writes the [s, s] scores to memory: its two
    products are priced by compute, and the softmax's passes over the scores move no bytes; without flash
    (the negative control) the same products are bound by the score matrix's traffic."""
    from dataclasses import replace

    from ds_hetero.planner.flops import vision_work

    h100 = PROFILES["h100"]
    no_flash = replace(h100, flash_attention=False)
    s, hd = 4096, 72  # one long image's attention for one head: the score matrix is 16.8M elements
    flash = h100.gemm_time(s, hd, s, kept="output")
    assert flash == pytest.approx(h100._tiled_seconds(s, hd, s, 1))  # compute, not the scores' bytes
    assert no_flash.gemm_time(s, hd, s, kept="output") == pytest.approx((s * hd + hd * s + s * s) * 2 / h100.memory_bw)
    assert no_flash.gemm_time(s, hd, s, kept="output") > 2 * flash
    assert h100.gemm_time(s, hd, s) == no_flash.gemm_time(s, hd, s, kept="output")  # no mark: every operand moves
    spec = _spec70()
    wl = Workload(seq_len=4096, image_tokens=576, global_batch=1, dtype_bytes=2)
    work = vision_work(spec, wl, 1, 1)
    assert {g.kept for g in work.gemms} >= {"output", "left"}
    assert work.score_bytes == 24 * 16 * 577 * 577 * 3 * 2  # layers x heads x (576 + CLS)^2 x 3 passes x bf16


def test_overlapped_launches_cost_the_slower_of_host_and_device():
    """machine.overlap_launches: a pass costs max(device, launches) instead of their sum; the profiles' default
    (the control) keeps the sum, so every plan is unchanged unless a caller asks for the overlap."""
    from dataclasses import replace

    from ds_hetero.planner.cost import _gemm_seconds, compute_parts
    from ds_hetero.planner.flops import vision_work

    spec = _spec70()
    wl = Workload(seq_len=4096, image_tokens=576, global_batch=1, dtype_bytes=2)
    work = vision_work(spec, wl, 1, 4)  # a ViT-L at tp 4 on one image: launches rival its device time
    h100 = PROFILES["h100"]
    parts = compute_parts(work, h100)
    device_f = parts["gemm"][0] + parts["elementwise"][0]
    assert _gemm_seconds(work, h100)[0] == pytest.approx(device_f + parts["launches"][0])
    overlapped = _gemm_seconds(work, replace(h100, overlap_launches=True))
    assert overlapped[0] == pytest.approx(max(device_f, parts["launches"][0]))
    assert overlapped[1] == pytest.approx(max(parts["gemm"][1] + parts["elementwise"][1], parts["launches"][1]))
    assert overlapped[0] < _gemm_seconds(work, h100)[0]
