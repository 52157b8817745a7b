"""Packed language batching without processes: the config keys, the plan, the boundary bytes.

The plan: deterministic, every sample once, in one (micro-batch, dp rank) bin of the whole batch
(samples move across the samples cut's micro-batches: a batch whose long samples all sit in one
of them is balanced over all), each bin's samples ascending, every bin busy, rows under the token
budget, the cost balanced (within LPT's bound; never worse than the contiguous cut on a skewed
mix; a per-micro-batch split as the negative control misses the 1.10 bar the cross-micro-batch
one meets) and O(n log n); the encoder passes cover exactly the samples of the micro-batches they
feed (one pass per micro-batch, one pass for several). The boundary: for packed plans of real samples,
every layout pair up to 4 ranks and both encoder balances, rows land at their packed positions
and the bytes equal both lower bounds (tests/helpers/plan_simulator.py); the positions the plan
hands the boundary are where the packed rows hold the placeholders.
"""

import random
import time

import pytest
import torch

from ds_hetero import HeteroConfigError
from ds_hetero.boundary import build_plan, shard_bounds
from ds_hetero.boundary.inputs import num_shards
from ds_hetero.config import load_config
from ds_hetero.families import adapter_for
from ds_hetero.models.packing import packed_language_inputs
from ds_hetero.toy import tiny_llava, tiny_qwen2_vl
from ds_hetero.validation import check_all
from ds_hetero.step.packing import (assign_bins, assign_samples, batch_load, cut_rows, language_cost_of,
                                    load_figures, pack_batch)
from ds_hetero.step.step_plan import StepPlan
from ds_hetero.testing.uneven import uneven_batches
from tests.helpers.plan_simulator import check
from tests.parallel.test_boundary_plan import layouts


def _ds(language, vision=None, batch=8, micro_batches=2, **section):
    return {"train_batch_size": batch, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "hetero_parallel": {"micro_batches": micro_batches, "language_batching": "packed", **section,
                                "stages": {"vision": vision or {"dp": 4}, "language": language}}}


# ---------------------------------------------------------------------------- config
def test_config_reads_the_keys_and_defaults_to_samples():
    cfg = load_config(_ds({"tp": 2, "dp": 2}, max_tokens_per_micro_batch=64), 4)
    assert cfg.packed and cfg.max_tokens_per_micro_batch == 64
    plain = _ds({"tp": 2, "dp": 2})
    del plain["hetero_parallel"]["language_batching"]
    cfg = load_config(plain, 4)
    assert cfg.language_batching == "samples" and not cfg.packed and cfg.max_tokens_per_micro_batch is None
    assert cfg.packed_attention is None and load_config(_ds({"dp": 4}, packed_attention="row_mask"), 4
                                                        ).packed_attention == "row_mask"


@pytest.mark.parametrize("section, field, words", [
    ({"language_batching": "tokens"}, "hetero_parallel.language_batching", "'samples' or 'packed'"),
    ({"max_tokens_per_micro_batch": 0}, "hetero_parallel.max_tokens_per_micro_batch", "positive integer"),
    ({"max_tokens_per_micro_batch": True}, "hetero_parallel.max_tokens_per_micro_batch", "positive integer"),
    ({"language_batching": "samples", "max_tokens_per_micro_batch": 64},
     "hetero_parallel.max_tokens_per_micro_batch", "\"packed\" only"),
    ({"packed_attention": "mask"}, "hetero_parallel.packed_attention", "'per_sample' or 'row_mask'"),
    ({"language_batching": "samples", "packed_attention": "row_mask"},
     "hetero_parallel.packed_attention", "\"packed\" only"),
])
def test_config_errors_name_the_field(section, field, words):
    with pytest.raises(HeteroConfigError) as e:
        load_config(_ds({"tp": 2, "dp": 2}, **section), 4)
    assert e.value.field == field and words in str(e.value)


def test_packed_with_a_pipelined_language_stage_is_accepted():
    # every pipeline stage of a dp replica builds the same packed rows from the plan, so the
    # activation shapes between them need no exchange (pipeline_parallel/hidden_shape.py)
    check_all(load_config(_ds({"dp": 2, "pp": 2}), 4))
    check_all(load_config(_ds({"tp": 2, "dp": 1, "pp": 2}, {"tp": 2, "dp": 1}, placement="first_stage"), 4))


def test_packed_gemma3_is_accepted_per_sample_only():
    from ds_hetero.toy import tiny_gemma3

    cfg = load_config(_ds({"dp": 4}), 4)
    check_all(cfg, tiny_gemma3(seed=0))  # each sample under its own masks (tests/families/test_gemma_packed_rows.py)
    ds = _ds({"dp": 4})
    ds["hetero_parallel"]["packed_attention"] = "row_mask"
    with pytest.raises(HeteroConfigError) as e:
        check_all(load_config(ds, 4), tiny_gemma3(seed=0))
    assert e.value.field == "hetero_parallel.packed_attention" and "Gemma 3" in str(e.value)
    check_all(load_config(ds, 4), tiny_llava("clip", seed=0))  # a family without image blocks may take it


# ---------------------------------------------------------------------------- plan
def sft_lengths(rng, n):
    """A scaled SFT mix: most one image + short text, some several, a fifth long text-only."""
    out = []
    for _ in range(n):
        u = rng.random()
        out.append(rng.randint(40, 80) if u < 0.7 else rng.randint(100, 200) if u < 0.8 else rng.randint(60, 400))
    return out


def test_assignment_is_balanced_deterministic_and_covers_every_sample():
    rng = random.Random(0)
    cost = language_cost_of(64, 256)
    for dp in (1, 2, 3, 4, 8):
        lengths = sft_lengths(rng, 8 * dp)
        shares = assign_samples(lengths, dp, cost)
        assert shares == assign_samples(lengths, dp, cost)
        assert sorted(i for s in shares for i in s) == list(range(len(lengths)))
        assert all(s == sorted(s) and s for s in shares)
        loads = [sum(cost(lengths[i]) for i in s) for s in shares]
        # LPT's bound: the slowest rank at most the mean plus the largest single sample
        assert max(loads) <= sum(loads) / dp + max(cost(n) for n in lengths)
        contiguous = [list(range(d * 8, (d + 1) * 8)) for d in range(dp)]
        packed = load_figures([[s] for s in [[i for i in share] for share in shares]], lengths, cost=cost)
        cut = load_figures([[[i] for i in share] for share in contiguous], lengths, cost=cost, packed=False)
        assert packed["max_mean"] <= cut["max_mean"] + 1e-12
        assert packed["real"] == packed["computed"] or dp > 1  # one row per rank: padding only across ranks


def test_rows_stay_under_the_budget_and_in_order():
    lengths = [10, 30, 5, 50, 7, 7, 7]
    rows = cut_rows(lengths, 20)
    assert rows == [[0], [1], [2], [3], [4, 5], [6]]
    assert cut_rows(lengths, None) == [list(range(7))]
    packed = pack_batch(lengths, 1, 2, language_cost_of(64, 256), 40)
    for mine in packed[0]:
        flat = [p for row in mine for p in row]
        assert flat == sorted(flat)
        assert all(sum(lengths[p] for p in row) <= 40 or len(row) == 1 for row in mine)


def test_planning_is_n_log_n():
    rng = random.Random(1)
    cost = language_cost_of()
    times = {}
    for n in (4096, 32768):
        lengths = sft_lengths(rng, n)
        start = time.perf_counter()
        assign_samples(lengths, 32, cost)
        assign_bins(lengths, 8, 32, cost)  # 8 micro-batches: O(n (log n + 8))
        times[n] = time.perf_counter() - start
    assert times[32768] < 8 * 8 * times[4096] + 0.05  # 8x the samples: far below quadratic (64x)


def _plan(family, language, vision=None, steps=3, **section):
    model = tiny_llava("clip", seed=1) if family == "llava" else tiny_qwen2_vl(seed=1)
    adapter = adapter_for(model)
    cfg = load_config(_ds(language, vision, **section), 4)
    return adapter, cfg, [StepPlan(cfg, adapter.encoders(), b, language_cost=adapter.language_cost)
                          for b in uneven_batches(family, model, steps, 8)]


def test_plan_packs_each_bin_and_covers_the_batch_once():
    adapter, cfg, plans = _plan("qwen2_vl", {"tp": 2, "dp": 2})
    moved = 0
    for plan in plans:
        seen = []
        for m in range(plan.micro_batches):
            mine = [plan.language_samples(d, m) for d in range(2)]
            assert [p for s in mine for p in s] == list(plan.micro_batch_samples(m))  # rank after rank
            assert all(list(s) == sorted(s) and s for s in mine)
            assert all(len(plan.language_rows(d, m)) == 1 for d in range(2))
            for d in range(2):
                assert all(plan.language_dp_of(p) == d for p in mine[d])
            seen += plan.micro_batch_samples(m)
            moved += sum(p // 4 != m for p in plan.micro_batch_samples(m))
        assert sorted(seen) == list(range(8))
    assert moved  # some sample left its samples-cut micro-batch


def _one_long(dp, micro_batches, short=40):
    """A batch whose one long sample (well over a rank's share of its micro-batch, but not over
    the step's: the other ranks can be given as much) sits in the samples cut's first
    micro-batch, every other sample short."""
    per = 8 * dp
    return [{2: 1000, 4: 600}[dp]] + [short] * (per * micro_batches - 1), per


def _inside(lengths, per, micro_batches, dp, cost):
    """The split inside each samples-cut micro-batch only (the negative control)."""
    return [tuple(tuple(tuple(p + m * per for p in row) for row in mine)
                  for mine in pack_batch(lengths[m * per:(m + 1) * per], 1, dp, cost)[0])
            for m in range(micro_batches)]


@pytest.mark.parametrize("dp, micro_batches", [(2, 2), (4, 2), (2, 4), (4, 4)])
def test_a_long_sample_gets_short_ones_from_other_micro_batches(dp, micro_batches):
    cost = language_cost_of()
    lengths, per = _one_long(dp, micro_batches)
    rows = pack_batch(lengths, micro_batches, dp, cost)
    flat = [p for per_mb in rows for mine in per_mb for row in mine for p in row]
    assert sorted(flat) == list(range(len(lengths)))
    assert rows == pack_batch(lengths, micro_batches, dp, cost)  # deterministic
    assert all(mine and list(mine[0]) == sorted(mine[0]) for per_mb in rows for mine in per_mb)
    moved = sum(p // per != m for m, per_mb in enumerate(rows) for mine in per_mb for row in mine for p in row)
    assert moved > 0  # samples left the samples cut's micro-batch
    mb_of_long = next(m for m, per_mb in enumerate(rows) for mine in per_mb for row in mine if 0 in row)
    assert len([p for mine in rows[mb_of_long] for row in mine for p in row]) > per  # its ranks got more work
    packed = batch_load(rows, lengths, cost=cost)
    inside = batch_load(_inside(lengths, per, micro_batches, dp, cost), lengths, cost=cost)
    # negative control: balanced inside each samples-cut micro-batch, the long sample's ranks wait
    assert inside["step_max_mean"] > 1.10 and inside["max_mean"] > 1.10, inside
    assert packed["step_max_mean"] <= 1.10 and packed["step_max_mean"] < inside["step_max_mean"], packed


def test_sft_mix_step_is_balanced_at_4_ranks():
    """The issue's bar (<= 1.10, real/computed >= 0.97) on the benchmark's mix at a batch with room
    (64 samples: 8 bins of 8); at batch 16 (2 samples a bin) a long sample alone is more than a
    rank's share, which no assignment can split (docs/packing.md has the figures)."""
    from ds_hetero.toy.length_mix import sft_lengths

    cost = language_cost_of(128, 512)
    for seed in range(3):
        lengths = sft_lengths(64, 9, seed=1000 + seed)
        per = 32
        packed = batch_load(pack_batch(lengths, 2, 4, cost), lengths, cost=cost)
        inside = batch_load(_inside(lengths, per, 2, 4, cost), lengths, cost=cost)
        assert packed["step_max_mean"] <= min(1.10, inside["step_max_mean"]), (packed, inside)  # never slower
        assert packed["real"] / packed["computed"] >= 0.97, packed


@pytest.mark.parametrize("vision_passes", [None, 1, 2])
def test_encoder_passes_cover_exactly_the_samples_they_feed(vision_passes):
    vision = {"dp": 4, **({"micro_batches": vision_passes} if vision_passes else {})}
    adapter, cfg, plans = _plan("llava", {"tp": 2, "dp": 2}, vision, micro_batches=4)
    for plan in plans:
        covered = []
        for p_ in plan.passes["vision"]:
            want = [p for m in p_.feeds for p in plan.micro_batch_samples(m)]
            assert list(p_.samples) == want  # micro-batch after micro-batch: the rows' arrival order
            assert [p_.index_of(p) for p in want] == list(range(len(want)))
            assert p_.boundary.dst_dp == tuple(plan.language_dp_of(p) for p in want)
            assert all(plan.pass_feeding("vision", m) is p_ for m in p_.feeds)
            covered += want
        assert sorted(covered) == list(range(8))


def test_samples_cut_is_unchanged():
    model = tiny_llava("clip", seed=1)
    adapter = adapter_for(model)
    ds = _ds({"tp": 2, "dp": 2})
    ds["hetero_parallel"]["language_batching"] = "samples"
    cfg = load_config(ds, 4)
    plan = StepPlan(cfg, adapter.encoders(), uneven_batches("llava", model, 1, 8)[0])
    assert [plan.language_samples(d, m) for m in range(2) for d in range(2)] == [
        range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert plan.language_rows(1, 1) == ((6,), (7,))
    assert plan.encoder_pass("vision", 1).boundary.dst_dp == (0, 0, 1, 1)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
@pytest.mark.parametrize("language", [{"tp": 2, "dp": 2, "sequence_parallel": True}, {"cp": 2, "dp": 2},
                                      {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}])
def test_boundary_positions_are_the_packed_rows_placeholders(family, language):
    adapter, cfg, plans = _plan(family, language, max_tokens_per_micro_batch=40)
    layout = cfg.language
    for plan, batch in zip(plans, uneven_batches(family, adapter.model, 3, 8)):
        for m in range(plan.micro_batches):
            p_ = plan.encoder_pass("vision", m)
            inputs = p_.boundary
            for d in range(layout.dp):
                rows = plan.language_rows(d, m)
                packed = packed_language_inputs(adapter, [[batch[p] for p in row] for row in rows],
                                                num_shards(layout))
                for r, row in enumerate(rows):
                    where = torch.nonzero(packed["input_ids"][r] == adapter.image_token_id).flatten().tolist()
                    assert [q for p in row for q in inputs.positions[p_.index_of(p)]] == where
                    assert all(inputs.seq_len[p_.index_of(p)] == packed["input_ids"].shape[-1] for p in row)
                # the rows a shard receives are what its shard of the packed rows holds
                for rank in layout.ranks:
                    if layout.coord(rank).dp != d:
                        continue
                    a, b = shard_bounds(layout, rank, packed["input_ids"].shape[-1])
                    held = int((packed["input_ids"][:, a:b] == adapter.image_token_id).sum())
                    assert plan.rows_of("vision", d, m, rank) == held


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
@pytest.mark.parametrize("balance", ["tokens", "position"])
def test_packed_boundary_is_exact_at_the_lower_bound_for_every_layout_pair(family, balance):
    model = tiny_llava("clip", seed=1) if family == "llava" else tiny_qwen2_vl(seed=1)
    adapter = adapter_for(model)
    batches = uneven_batches(family, model, 2, 8)
    cases = 0
    for n in (2, 4):
        for dst in layouts(n, "language", range(n), with_cp=True):
            for src in layouts(n, "vision", range(n), with_cp=False):
                ds = _ds({"tp": dst.tp, "cp": dst.cp, "dp": dst.dp, "sequence_parallel": dst.sequence_parallel},
                         {"tp": src.tp, "dp": src.dp}, balance=balance, max_tokens_per_micro_batch=48)
                cfg = load_config(ds, n)
                for b in batches:
                    plan = StepPlan(cfg, adapter.encoders(), b, language_cost=adapter.language_cost)
                    for v in range(2):
                        check(build_plan(cfg.stages["vision"], cfg.language, plan.encoder_pass("vision", v).boundary))
                        cases += 1
    assert cases > 50


def test_language_load_reports_padding_and_balance():
    model = tiny_llava("clip", seed=1)
    adapter = adapter_for(model)
    batch = uneven_batches("llava", model, 1, 8)[0]
    loads = {}
    for batching in ("samples", "packed"):
        ds = _ds({"tp": 2, "dp": 2, "sequence_parallel": True})
        ds["hetero_parallel"]["language_batching"] = batching
        plan = StepPlan(load_config(ds, 4), adapter.encoders(), batch, language_cost=adapter.language_cost)
        loads[batching] = plan.language_load()
    real = sum(int(s["input_ids"].numel()) for s in batch)
    assert loads["samples"]["real"] == loads["packed"]["real"] == real
    assert loads["samples"]["computed"] > real  # each share padded to its longest sample
    assert loads["packed"]["computed"] - real < 2 * 2 * 2  # only up to the 2 shards, per rank and micro-batch
    assert 1.0 <= loads["packed"]["max_mean"] < loads["samples"]["max_mean"]


@pytest.mark.parametrize("placement, vision_passes", [("colocated", 1), ("disaggregated", None)])
@pytest.mark.parametrize("balance", ["position", "tokens"])
def test_data_path_reads_every_sample_a_rank_uses(balance, placement, vision_passes):
    """Packed: a rank's language and encoder samples are known only from the plan; what it reads
    before the batch and once the plan is known covers every sample it touches (disaggregated:
    encoder-only ranks too; any encoder balance)."""
    from ds_hetero.step.rank_data import HeldShare, RankDataPath

    model = tiny_llava("clip", seed=1)
    adapter = adapter_for(model)
    vision = {"dp": 2, **({"micro_batches": vision_passes} if vision_passes else {})}
    ds = _ds({"dp": 2}, vision, batch=16, micro_batches=4, balance=balance, placement=placement)
    cfg = load_config(ds, 4 if placement == "disaggregated" else 2)
    for batch in uneven_batches("llava", model, 2, 16):
        plan = StepPlan(cfg, adapter.encoders(), batch, language_cost=adapter.language_cost)
        for stage, passes in (("vision", vision_passes or 4), ("language", 4)):
            for dp in range(2):
                path = RankDataPath(cfg, adapter, [HeldShare(stage, dp, passes)], None)
                read = path.needed_positions() | path.balanced_positions(plan)
                used = plan.language_positions(dp) if stage == "language" else plan.encoder_positions(stage, dp)
                assert used <= read, (stage, dp, sorted(used - read))
                assert not path.needed_positions()  # nothing is known before the plan
