"""Packed rows for a dense attention kernel (step/rows.py): of the balanced rows and the ordered cuts,
those whose padded rows cost least; one row for varlen kernels; the adapter tells the two apart."""

import random

from ds_hetero.step.packing import language_cost_of, pack_batch
from ds_hetero.step.rows import (BUDGET_STEP, balanced_rows, cut_rows, dense_rows, padded_rows_cost,
                                 tried_row_counts)


def _shipped_like(n=16, seed=0):
    rng = random.Random(seed)
    return [rng.randint(17, 162) for _ in range(n)]


def test_dense_rows_cost_least_of_the_rows_tried():
    cost = language_cost_of(128, 512)  # the packing benchmark's width: attention outweighs the linears
    lengths = _shipped_like()
    rows = dense_rows(lengths, cost)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))  # every sample once
    assert all(row == sorted(row) for row in rows)  # batch order inside a row
    got = padded_rows_cost(rows, lengths, cost)
    one_row = padded_rows_cost([list(range(len(lengths)))], lengths, cost)
    one_each = padded_rows_cost([[i] for i in range(len(lengths))], lengths, cost)
    assert len(rows) > 1 and got < 0.6 * one_row and got < one_each, (len(rows), got, one_row, one_each)
    budget, ordered = max(lengths), []
    while budget < sum(lengths):
        ordered.append(padded_rows_cost(cut_rows(lengths, int(budget)), lengths, cost))
        budget *= BUDGET_STEP
    balanced = [padded_rows_cost(balanced_rows(lengths, r), lengths, cost) for r in tried_row_counts(len(lengths))]
    assert got == min(ordered + balanced + [one_row])
    assert got < min(ordered + [one_row])  # here the balanced rows are cheaper than any ordered cut
    assert [i for row in rows for i in row] != list(range(len(lengths)))  # ... and not in batch order


def test_balanced_rows_are_near_equal_and_never_worse_than_the_ordered_cut():
    assert list(tried_row_counts(20)) == [1, 2, 3, 4, 5, 7, 9, 12, 16]
    rows = balanced_rows([50, 10, 40, 20, 30, 30], 3)
    assert rows == [[0, 1], [2, 3], [4, 5]]  # 60, 60, 60: longest first, each into the shortest row
    assert balanced_rows([5, 5], 4) == [[0], [1]]  # no empty rows
    cost = language_cost_of(128, 512)
    rng = random.Random(7)
    for _ in range(200):  # where next fit in batch order is cheaper, dense_rows keeps it
        lengths = [rng.choice([rng.randint(10, 60), rng.randint(200, 900)]) for _ in range(rng.randint(1, 12))]
        got = padded_rows_cost(dense_rows(lengths, cost), lengths, cost)
        assert got <= padded_rows_cost(cut_rows(lengths, None), lengths, cost)
        assert got <= padded_rows_cost(cut_rows(lengths, max(lengths)), lengths, cost)


def test_dense_rows_stay_one_row_where_the_linears_dominate_and_round_to_the_shards():
    cost = language_cost_of(4096, 11008)
    assert dense_rows([30, 25, 40, 10], cost) == [[0, 1, 2, 3]]  # more rows would add padding
    lengths = _shipped_like(seed=3)
    rows = dense_rows(lengths, language_cost_of(128, 512), multiple=4)
    assert padded_rows_cost(rows, lengths, language_cost_of(128, 512), 4) % 1 == 0
    assert all(len(r) for r in rows)


def test_pack_batch_cuts_rows_only_for_a_dense_kernel_without_a_budget():
    cost = language_cost_of(128, 512)
    lengths = _shipped_like(32, seed=1)
    varlen = pack_batch(lengths, 2, 2, cost)
    dense = pack_batch(lengths, 2, 2, cost, dense=True)
    assert all(len(rows) == 1 for per_mb in varlen for rows in per_mb)
    assert any(len(rows) > 1 for per_mb in dense for rows in per_mb)
    # the same samples on the same ranks: only the rows differ
    flat = lambda out: [[sorted(p for row in rows for p in row) for rows in per_mb] for per_mb in out]  # noqa: E731
    assert flat(dense) == flat(varlen)
    assert pack_batch(lengths, 2, 2, cost, 40, dense=True) == pack_batch(lengths, 2, 2, cost, 40)  # a budget wins


def test_adapter_says_when_rows_are_scored_whole():
    from ds_hetero.families import adapter_for
    from ds_hetero.toy import tiny_llava

    model = tiny_llava("clip", seed=0)
    adapter = adapter_for(model)
    # sdpa: per sample by default (one row), whole rows under "row_mask"
    assert model.config.text_config._attn_implementation == "sdpa"
    assert not adapter.dense_rows() and not adapter.dense_rows("per_sample") and adapter.dense_rows("row_mask")
    model.config.text_config._attn_implementation_internal = "flash_attention_2"  # varlen: one row
    assert not adapter_for(model).dense_rows() and adapter_for(model).packed_attention() == "kernel"
