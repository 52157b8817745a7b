"""How one language dp rank's samples of a micro-batch become packed rows (step/packing.py
assigns the samples; models/packing.py builds the rows).

A row may hold any of the rank's samples: the plan delivers a rank's encoder rows in the order of
its rows, flattened (StepPlan.micro_batch_samples lists each rank's samples row after row), which
is the order of the placeholders in the flattened rows (boundary/inputs.py). Inside a row the
samples keep ascending batch order.

Which rows depends on the attention. Flash-attention's varlen kernel (and flex attention's block
mask), and sdpa or eager called once per sample (models/per_sample_attention.py, the default for
them), compute each sample's own scores: one row per rank is right, and its cost is its samples'
own. Under `max_tokens_per_micro_batch` the rows are cut by next fit in
batch order (`cut_rows`). sdpa and eager scoring a whole row (`packed_attention` "row_mask") are
dense: transformers turns packed `position_ids` into a block-diagonal causal mask, but the kernel
still computes the row's whole L x L. One row
of n samples then costs the attention of their total length, squared: on the shipped dataset at
global batch 64 on 2 ranks (16 samples a row) about 5x the score entries of the padded samples'.
For a dense kernel without a budget, `dense_rows` therefore picks the rows whose cost, each row
padded to the rank's longest (R rows of L tokens: R * cost(L), `cost` counting attention over the
whole row), is least, of two families: R rows of near-equal length (`balanced_rows`, longest
sample first into the shortest row) for R = 1, 2, 3, 4, 5, 7, ... until the rows are as short as
the longest sample, and next fit in batch order under the rank's longest sample times 2^(k/2) up to its total
(the balanced rows are cheaper on almost every rank; the ordered cut keeps the rest from being
worse than it), both on a geometric grid of row counts and budgets. Each candidate is priced
from its shape alone (its row count and longest row) and only the chosen one is built:
O(n log^2 n) for n samples, a pure function of the lengths, the same on every rank.
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterator, Sequence

from .balance import lpt

# the budgets dense_rows tries grow by this factor: finer steps find rows a few per cent cheaper
# at proportionally more host time per step
BUDGET_STEP = 2 ** 0.5


def _next_fit(lengths: Sequence[int], budget: int) -> Iterator[tuple[int, int]]:
    """Per sample, in order: (its row, that row's tokens so far) under next fit: consecutive
    samples while they fit under `budget`; a longer sample has a row of its own."""
    row, used = -1, budget + 1
    for n in lengths:
        if used + n > budget:
            row, used = row + 1, 0
        used += n
        yield row, used


def cut_rows(lengths: Sequence[int], budget: int | None) -> list[list[int]]:
    """The packed rows of one rank's samples (indices into `lengths`, kept in order): one row, or
    under `budget` the rows of next fit (`_next_fit`)."""
    if budget is None:
        return [list(range(len(lengths)))]
    rows: list[list[int]] = []
    for i, (row, _) in enumerate(_next_fit(lengths, budget)):
        if row == len(rows):
            rows.append([])
        rows[row].append(i)
    return rows


def padded_cost(count: int, longest: int, cost: Callable[[int], int], multiple: int = 1) -> int:
    """A dense kernel's work on `count` rows padded to `longest` tokens (rounded up to `multiple`),
    all of each row's L x L scored."""
    return count * cost(-(-longest // multiple) * multiple)


def padded_rows_cost(rows: Sequence[Sequence[int]], lengths: Sequence[int], cost: Callable[[int], int],
                     multiple: int = 1) -> int:
    """`padded_cost` of these rows, each padded to the longest."""
    return padded_cost(len(rows), max(sum(lengths[i] for i in row) for row in rows), cost, multiple)


def balanced_rows(lengths: Sequence[int], count: int) -> list[list[int]]:
    """`count` rows of near-equal length: step/balance.py's `lpt` of the samples over the rows
    (the longest first, each into the shortest row so far); each row's indices ascending, the rows
    ordered by their first."""
    rows: list[list[int]] = [[] for _ in range(count)]
    for i, r in enumerate(lpt(lengths, count)):
        rows[r].append(i)
    return sorted((row for row in rows if row), key=lambda row: row[0])


def _balanced_longest(longest_first: Sequence[int], count: int) -> int:
    """The longest of `balanced_rows`' `count` rows, from the lengths sorted longest first, without
    building them: the same greedy as `lpt` on bare loads (which row takes a tie changes no row's
    length), sorted once for every count tried; `lpt` + `loads` would sort and allocate per count,
    which doubles the plan's host time at batch 256."""
    heap = [0] * count
    for n in longest_first:
        heapq.heapreplace(heap, heap[0] + n)
    return max(heap)


def tried_row_counts(n: int) -> Iterator[int]:
    """The row counts `dense_rows` tries for the balanced rows of n samples: 1, 2, 3, 4, 5, 7, 9,
    12, ... (each about BUDGET_STEP times the last), up to n: O(log n) of them."""
    count = 1
    while count <= n:
        yield count
        count = max(count + 1, int(count * BUDGET_STEP))


def dense_rows(lengths: Sequence[int], cost: Callable[[int], int], multiple: int = 1) -> list[list[int]]:
    """The rows of one rank's samples for a dense attention kernel: of the balanced rows and the
    ordered cuts tried (module docstring), those whose padded rows cost least; ties: fewer rows,
    then the balanced. Each candidate is priced from its shape; only the chosen one is built."""
    total, longest = sum(lengths), max(lengths)
    longest_first = sorted(lengths, reverse=True)
    best_key, build = None, None
    for count in tried_row_counts(len(lengths)):
        row_length = _balanced_longest(longest_first, count)
        key = (padded_cost(count, row_length, cost, multiple), count, 0)
        if best_key is None or key < best_key:
            best_key, build = key, (balanced_rows, count)
        if row_length <= longest:
            break  # as short as rows get: more of them only cost more
    budget = longest
    while True:
        cut = min(int(budget), total)
        rows, row_length = 0, 0
        for row, used in _next_fit(lengths, cut):  # cut_rows' shape, unbuilt
            rows, row_length = row + 1, max(row_length, used)
        key = (padded_cost(rows, row_length, cost, multiple), rows, 1)
        if key < best_key:
            best_key, build = key, (cut_rows, cut)
        if budget >= total:
            return build[0](lengths, build[1])
        budget *= BUDGET_STEP
