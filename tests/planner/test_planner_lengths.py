"""`ds-hetero plan` on a length mix: the language stage priced as the runtime cuts the samples (pure).

Hand-counted figures of a small mix (samples cut against packed), the plan's figures equal to the
StepPlan's on the same samples, and a uniform mix leaving every prediction as it was.
"""

from __future__ import annotations

import pytest
import torch

from ds_hetero.config import load_config
from ds_hetero.planner import machine_profile
from ds_hetero.cli import main as cli_main
from ds_hetero.planner.cli import read_lengths
from ds_hetero.planner.language_mix import equivalent, language_load, step_work
from ds_hetero.planner.search import plan
from ds_hetero.step.packing import language_cost_of
from ds_hetero.step.step_plan import StepPlan
from ds_hetero.toy.length_mix import sft_lengths

# widths with 4 h + 2 ffn = 6: a sample of n tokens costs n (6 + 2 n)
H, FFN = 1, 1


def test_hand_counted_small_mix_samples_cut_against_packed():
    lengths = (10, 2, 2, 2)  # one micro-batch, language dp 2
    cut = step_work(lengths, 2, 1, 1, False, None, H, FFN)[0]
    packed = step_work(lengths, 2, 1, 1, True, None, H, FFN)[0]
    # samples cut: rank 0 takes (10, 2), both rows padded to 10; rank 1 (2, 2)
    assert [(w.tokens, w.attention, w.real) for w in cut] == [(20, 200, 12), (4, 8, 4)]
    # packed: LPT puts the 10 alone on rank 0, the three 2s end to end on rank 1 (a row of 6)
    assert [(w.tokens, w.attention, w.real) for w in packed] == [(10, 100, 10), (6, 12, 6)]
    s = language_load(lengths, 2, 1, 1, False, None, H, FFN)
    p = language_load(lengths, 2, 1, 1, True, None, H, FFN)
    assert (s["real"], s["computed"]) == (16, 24) and (p["real"], p["computed"]) == (16, 16)
    # loads: cut 2 x 10 x 26 = 520 against 2 x 2 x 10 = 40; packed 260 against 3 x 20 = 60
    assert s["max_mean"] == pytest.approx(520 / 280) and p["max_mean"] == pytest.approx(260 / 160)
    # the equivalent uniform micro-batch: T tokens, A score entries
    assert equivalent(20, 200) == (2, 10) and equivalent(6, 12) == (3, 2)
    # shard rounding (cp x sp = 4): the packed row of 6 is padded to 8, linear only
    assert [(w.tokens, w.attention) for w in step_work(lengths, 2, 1, 4, True, None, H, FFN)[0]] == [(12, 100), (8, 12)]


def _samples(lengths):
    return [{"input_ids": torch.zeros(n, dtype=torch.long)} for n in lengths]


@pytest.mark.parametrize("dense", [False, True], ids=["varlen", "dense"])
@pytest.mark.parametrize("batching,budget,lang", [
    ("samples", None, {"dp": 2}), ("packed", None, {"dp": 2}), ("packed", 300, {"dp": 4}),
    ("packed", None, {"tp": 2, "dp": 2, "sequence_parallel": True}), ("samples", None, {"cp": 2, "dp": 2})])
def test_plan_figures_equal_the_step_plans(batching, budget, lang, dense):
    lengths = sft_lengths(16, scale=9, seed=3)
    world = lang.get("tp", 1) * lang.get("cp", 1) * lang["dp"]
    section = {"micro_batches": 2, "language_batching": batching, "stages": {"vision": {"dp": world}, "language": lang}}
    if budget:
        section["max_tokens_per_micro_batch"] = budget
    cfg = load_config({"train_batch_size": 16, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                       "hetero_parallel": section}, world)
    runtime = StepPlan(cfg, {}, _samples(lengths), language_cost=language_cost_of(64, 172),
                       dense_attention=dense).language_load()
    shards = lang.get("cp", 1) * (lang.get("tp", 1) if lang.get("sequence_parallel") else 1)
    planned = language_load(lengths, cfg.language.dp, 2, shards, batching == "packed", budget, 64, 172, dense)
    assert planned == runtime
    if batching == "packed" and budget is None:  # the kernels cut different rows: the check sees the kernel
        other = language_load(lengths, cfg.language.dp, 2, shards, True, None, 64, 172, not dense)
        assert other != planned
    if batching == "samples":
        assert planned["computed"] > planned["real"]  # the mix pads: the check can see a difference


def _plan(lengths=None, batching=None, packed_attention=None, **kw):
    base = {"train_batch_size": 16, "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}
    if batching:
        base["hetero_parallel"] = {"language_batching": batching}
    if packed_attention:
        base["hetero_parallel"]["packed_attention"] = packed_attention
    return plan("tiny-llava", 4, 96, 16, 16, machine_profile("h100"), base=base, lengths=lengths, **kw)


def _figures(p):
    return [(p.candidate.label(), p.step_s, p.tokens_per_s, p.tflops_per_device, tuple(p.peak_memory.items()),
             p.fits, p.runnable) for p in p_list] if (p_list := p.predictions) else []


@pytest.mark.parametrize("batching", ["samples", "packed"])
def test_a_uniform_mix_leaves_every_prediction_unchanged(batching):
    ref = _figures(_plan())
    assert _figures(_plan([96] * 16, batching)) == ref


def test_a_long_tailed_mix_prices_padding_and_packing_wins():
    lengths = [16 + n for n in sft_lengths(16, scale=9, seed=1)]
    cut, packed, uniform = _plan(lengths, "samples"), _plan(lengths, "packed"), _plan()
    for a, b in ((cut, packed), (cut, uniform)):
        assert a.best_megatron().step_s != b.best_megatron().step_s  # the baseline is priced on the data too
    assert packed.best.step_s < cut.best.step_s
    assert packed.best_megatron().step_s < cut.best_megatron().step_s
    assert packed.best.tokens_per_s == pytest.approx(sum(lengths) / packed.best.step_s)
    cfg = packed.ds_config(packed.best)
    assert cfg["hetero_parallel"]["language_batching"] == "packed"  # the written config trains what was priced
    # tiny-llava runs sdpa, by default called per sample: priced as each sample's own attention in one row
    assert not packed.workload.dense
    assert _plan(lengths, "packed", attention="varlen").best.step_s == packed.best.step_s
    row_mask = _plan(lengths, "packed", "row_mask")  # each row scored whole, rows cut for that
    assert row_mask.workload.dense and packed.best.step_s < row_mask.best.step_s
    assert row_mask.ds_config(row_mask.best)["hetero_parallel"]["packed_attention"] == "row_mask"  # kept
    assert _plan(lengths, "packed", attention="dense").best.step_s == row_mask.best.step_s
    with pytest.raises(ValueError, match="attention 'flash'"):
        _plan(lengths, "packed", attention="flash")


def test_cli_takes_lengths(tmp_path, capsys):
    f = tmp_path / "lengths.txt"
    f.write_text(" ".join(str(n) for n in sft_lengths(16, 9, 2)))
    assert read_lengths(str(f), 16) == sft_lengths(16, 9, 2) == read_lengths("sft:2:9", 16)
    cfg = tmp_path / "base.json"
    cfg.write_text('{"train_batch_size": 16, "hetero_parallel": {"language_batching": "packed"}}')
    assert cli_main(["plan", "--model", "tiny-llava", "--world-size", "4", "--seq-len", "96", "--image-tokens", "16",
                      "--global-batch", "16", "--machine", "h100", "--no-modelled", "--config", str(cfg),
                      "--lengths", str(f), "--attention", "varlen"]) == 0
    assert "packed" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--lengths"):
        _plan([96] * 8, "packed")
