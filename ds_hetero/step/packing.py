"""Packed language micro-batches: the global batch's samples to (micro-batch, dp rank) bins by token cost.

With `hetero_parallel.language_batching` "packed" the language stage does not give dp rank d the
d-th contiguous share of a consecutive micro-batch padded to its longest sample. Instead every
sample of the global batch goes to one of `micro_batches x dp` bins (bin m * dp + d: dp rank d's
part of language micro-batch m) by its language cost (the cost counts attention's quadratic
term, as the encoder's does), and each
bin's samples are laid end to end in one packed row (or, under `max_tokens_per_micro_batch`, a
few rows of at most that many tokens; a longer sample has a row of its own; for attention that
scores rows whole, sdpa or eager under `packed_attention` "row_mask", the rows that cost it least:
step/rows.py). Each sample keeps
its own positions (restarting at 0), so the decoder's mask keeps attention inside it
(models/packing.py builds the row).

The bins are filled greedily, largest cost first, to keep the STEP short, not each bin equal: the
language dp ranks meet at every boundary exchange (one per encoder pass) and at the gradient
reduction, so a step costs about the sum over micro-batches of its slowest bin. A sample goes to
the micro-batch whose slowest bin it raises least (none, where its least loaded bin has room below
that micro-batch's slowest: the ranks would wait anyway), that micro-batch's least loaded rank;
ties: the least loaded bin, then the lowest micro-batch and rank. So a long sample's micro-batch
gives its other ranks work up to its length, and the short samples fill the rest. Two guards: a
bin takes no more tokens than `TOKEN_SLACK` times the mean bin's (or the longest sample) while
another bin has room (the activations of one micro-batch stay near the flat split's), and every
bin gets at least one sample. And it is never slower than the split inside the samples cut's
micro-batches (step/balance.py `lpt` per micro-batch, this module's first rule: a long sample
among few left max/mean 1.47 at 4 ranks on the SFT mix): where that one's summed slowest bins
cost less, it is kept. Why not a flat LPT over all the bins (every bin equal): the other ranks
of a long sample's micro-batch would still wait for it. A sample therefore moves out of the micro-batch the samples cut puts it in: the
StepPlan's encoder passes then cover the samples of the micro-batches they feed (step/
step_plan.py), and the data paths read them once the plan is known (step/rank_data.py). Inside a
bin, samples go into rows (step/rows.py), each row's in ascending batch order, and the plan lists
a bin's samples row after row: the boundary's destination order (boundary/inputs.py: a pass's
samples in its order, then positions) is then the order of the placeholders in the flattened rows.

Pure and deterministic: a function of the samples' lengths alone (light samples will do), the
same on every rank without communication; O(n (log n + M)) for n samples and M micro-batches
(each sample looks at every micro-batch's least loaded rank, a heap per micro-batch).
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

from .balance import lpt
from .rows import cut_rows, dense_rows

# Width of a language layer when the model's is not known (a pure plan without an adapter):
# only the ratio of the linear to the quadratic term matters for the assignment.
DEFAULT_HIDDEN, DEFAULT_FFN = 4096, 11008
# A bin's tokens at most this times the mean bin's (or the longest sample) while another has room.
TOKEN_SLACK = 1.25


def language_cost_of(hidden: int = DEFAULT_HIDDEN, ffn: int = DEFAULT_FFN) -> Callable[[int], int]:
    """tokens -> one decoder layer's work on a sample of that many tokens (attention over the
    sample itself: packing keeps it inside the sample). Causal attention does half the scores
    of full attention; the factor is common to every sample, so the full term is kept. The
    encoder's formula (models/item_cost.py `transformer_cost`) with the attention length the sample's."""
    return lambda tokens: tokens * (4 * hidden + 2 * ffn + 2 * tokens)


def assign_samples(lengths: Sequence[int], dp: int, cost: Callable[[int], int]) -> list[list[int]]:
    """Per dp rank: the indices (into `lengths`) of its samples, ascending. LPT on the cost; with
    at least `dp` samples every rank gets one (the first `dp` by cost go one to each). The split
    of one micro-batch alone (the comparison of tests/step/test_packing_plan.py)."""
    if len(lengths) < dp:
        raise ValueError(f"{len(lengths)} samples cannot give each of {dp} language dp ranks one")
    ranks = lpt([max(cost(n), 1) for n in lengths], dp)
    out: list[list[int]] = [[] for _ in range(dp)]
    for i, r in enumerate(ranks):
        out[r].append(i)
    return out


def assign_bins(lengths: Sequence[int], micro_batches: int, dp: int, cost: Callable[[int], int]
                ) -> list[list[int]]:
    """Per bin `m * dp + d` (dp rank d's part of micro-batch m): the indices (into `lengths`) of
    its samples, ascending; the greedy of the module docstring. Every bin gets at least one."""
    bins = micro_batches * dp
    if len(lengths) < bins:
        raise ValueError(f"{len(lengths)} samples cannot give each of {dp} language dp ranks one in each of "
                         f"{micro_batches} micro-batches")
    costs = [max(cost(n), 1) for n in lengths]
    cap = max(max(lengths), TOKEN_SLACK * sum(lengths) / bins)
    heaps = [[(0, d) for d in range(dp)] for _ in range(micro_batches)]  # (cost, rank) per micro-batch
    tokens = [0] * bins
    top = [0] * micro_batches  # each micro-batch's slowest bin
    empty, out = bins, [[] for _ in range(bins)]
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    for k, i in enumerate(order):
        c, force = costs[i], len(order) - k <= empty  # force: the rest only just fill the empty bins
        best = None
        for m in range(micro_batches):
            load, d = heaps[m][0]
            if force and load:
                continue
            over = load > 0 and tokens[m * dp + d] + lengths[i] > cap
            key = (over, max(0, load + c - top[m]), load, m)
            best = key if best is None or key < best else best
        m = best[3]
        load, d = heapq.heappop(heaps[m])
        heapq.heappush(heaps[m], (load + c, d))
        top[m] = max(top[m], load + c)
        empty -= load == 0
        tokens[m * dp + d] += lengths[i]
        out[m * dp + d].append(i)
    return [sorted(b) for b in out]


def _slowest_sum(members: Sequence[Sequence[int]], lengths: Sequence[int], dp: int, cost) -> int:
    """The step's time in cost units: each micro-batch's slowest bin, summed."""
    loads = [sum(max(cost(lengths[i]), 1) for i in mine) for mine in members]
    return sum(max(loads[m:m + dp]) for m in range(0, len(loads), dp))


def pack_batch(lengths: Sequence[int], micro_batches: int, dp: int, cost: Callable[[int], int],
               budget: int | None = None, dense: bool = False, multiple: int = 1
               ) -> tuple[tuple[tuple[tuple[int, ...], ...], ...], ...]:
    """`out[m][d][r]`: the batch positions (indices into `lengths`) in row r of dp rank d's part of
    language micro-batch m, each row ascending (`assign_bins`, or the split inside the samples cut's
    micro-batches where it is faster; then `cut_rows` under `budget`, or without one, for a
    `dense` attention (sdpa or eager scoring rows whole), step/rows.py `dense_rows` with rows padded to a
    multiple of `multiple`)."""
    members = assign_bins(lengths, micro_batches, dp, cost)
    size = len(lengths) // micro_batches
    inside = [[m * size + i for i in mine] for m in range(micro_batches)
              for mine in assign_samples(lengths[m * size:(m + 1) * size], dp, cost)]
    if _slowest_sum(inside, lengths, dp, cost) < _slowest_sum(members, lengths, dp, cost):
        members = inside
    out = []
    for m in range(micro_batches):
        per_rank = []
        for mine in members[m * dp:(m + 1) * dp]:
            mine_lengths = [lengths[i] for i in mine]
            rows = (dense_rows(mine_lengths, cost, multiple) if dense and budget is None
                    else cut_rows(mine_lengths, budget))
            per_rank.append(tuple(tuple(mine[i] for i in row) for row in rows))
        out.append(tuple(per_rank))
    return tuple(out)


def load_figures(rows: Sequence[Sequence[Sequence[int]]], lengths: Sequence[int], multiple: int = 1,
                 cost: Callable[[int], int] | None = None, packed: bool = True) -> dict[str, float]:
    """Real and computed tokens of one micro-batch's rows on every dp rank (`rows[d]` its rows of
    batch positions, `lengths[p]` sample p's tokens): rows are padded to the rank's longest,
    rounded up to `multiple`. `max_mean`: the slowest rank's work over the mean (1.0: balanced);
    a rank's work (`loads`) is its samples' costs and the linear cost of its padding when `packed`
    (attention stays inside each sample), each padded row's whole cost when not."""
    cost = cost or language_cost_of()
    real = computed = 0
    loads = []
    for mine in rows:
        longest = max(sum(lengths[p] for p in row) for row in mine)
        longest = -(-longest // multiple) * multiple
        tokens = sum(lengths[p] for row in mine for p in row)
        real += tokens
        computed += longest * len(mine)
        if packed:
            loads.append(sum(cost(lengths[p]) for row in mine for p in row) + (longest * len(mine) - tokens) * cost(1))
        else:
            loads.append(cost(longest) * len(mine))
    mean = sum(loads) / len(loads)
    return {"real": real, "computed": computed, "max_mean": max(loads) / mean if mean else 1.0, "loads": loads}


def batch_load(rows: Sequence[Sequence[Sequence[Sequence[int]]]], lengths: Sequence[int], multiple: int = 1,
               cost: Callable[[int], int] | None = None, packed: bool = True) -> dict[str, float]:
    """A step's language figures from its rows (`rows[m][d]`, `load_figures` per micro-batch):
    `real` and `computed` tokens summed, `max_mean` of the worst micro-batch, and `step_max_mean`,
    the slowest rank's work summed over the micro-batches over their means summed: the step's time
    over a balanced step's (the ranks meet at every boundary exchange). StepPlan.language_load's
    and the planner's figures."""
    figures = [load_figures(per_mb, lengths, multiple, cost, packed) for per_mb in rows]
    slowest = sum(max(f["loads"]) for f in figures)
    mean = sum(sum(f["loads"]) / len(f["loads"]) for f in figures)
    return {"real": sum(f["real"] for f in figures), "computed": sum(f["computed"] for f in figures),
            "max_mean": max([1.0] + [f["max_mean"] for f in figures]),
            "step_max_mean": slowest / mean if mean else 1.0}
