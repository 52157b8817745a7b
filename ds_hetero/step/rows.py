"""How one language dp rank's samples of a micro-batch become packed rows (step/packing.py
assigns the samples; models/packing.py builds the rows).

Inside a rank, samples keep ascending batch order, and so do the rows: the boundary delivers a
rank's encoder rows in that order (boundary/inputs.py), which must be the order of the
placeholders in the flattened rows. So rows are cut by next fit: consecutive samples while they
fit under a budget.

Which budget depends on the attention kernel. Flash-attention's varlen kernel (and flex
attention's block mask) computes each sample's own scores: one row per rank is right, and its
cost is its samples' own. sdpa and eager are dense: transformers turns packed `position_ids`
into a block-diagonal causal mask, but the kernel still computes the row's whole L x L. One row
of n samples then costs the attention of their total length, squared: on the shipped dataset at
global batch 64 on 2 ranks (16 samples a row) about 5x the score entries of the padded samples'.
For a dense kernel without `max_tokens_per_micro_batch`, `dense_rows` therefore picks the budget
per rank: the one whose rows, each padded to the rank's longest, cost least (R rows of L tokens:
R * cost(L), `cost` counting attention over the whole row). Tried: the rank's longest sample
times 2^(k/2), up to its total (one row); O(n log(total / longest)) for n samples, a pure function
of the lengths, the same on every rank.
"""

from __future__ import annotations

from typing import Callable, Sequence

# the budgets dense_rows tries grow by this factor: finer steps find rows a few per cent cheaper
# at proportionally more host time per step
BUDGET_STEP = 2 ** 0.5


def cut_rows(lengths: Sequence[int], budget: int | None) -> list[list[int]]:
    """The packed rows of one rank's samples (indices into `lengths`, kept in order): one row, or
    under `budget` consecutive samples while they fit (next fit); a longer sample has a row of its own."""
    if budget is None:
        return [list(range(len(lengths)))]
    rows: list[list[int]] = []
    used = budget + 1
    for i, n in enumerate(lengths):
        if used + n > budget:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += n
    return rows


def padded_rows_cost(rows: Sequence[Sequence[int]], lengths: Sequence[int], cost: Callable[[int], int],
                     multiple: int = 1) -> int:
    """A dense kernel's work on these rows: each padded to the longest (rounded up to `multiple`),
    all of its L x L scored."""
    longest = max(sum(lengths[i] for i in row) for row in rows)
    return len(rows) * cost(-(-longest // multiple) * multiple)


def dense_rows(lengths: Sequence[int], cost: Callable[[int], int], multiple: int = 1) -> list[list[int]]:
    """The rows of one rank's samples for a dense attention kernel: `cut_rows` under the budget,
    of those tried (module docstring), whose padded rows cost least; ties: the larger budget
    (fewer rows)."""
    total, budget = sum(lengths), max(lengths)
    best, best_cost = None, None
    while True:
        rows = cut_rows(lengths, min(int(budget), total))
        work = padded_rows_cost(rows, lengths, cost, multiple)
        if best_cost is None or work <= best_cost:
            best, best_cost = rows, work
        if budget >= total:
            return best
        budget *= BUDGET_STEP
