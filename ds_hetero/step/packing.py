"""Packed language micro-batches: a micro-batch's samples to language dp ranks by token cost.

With `hetero_parallel.language_batching` "packed" the language stage does not give dp rank d the
d-th contiguous share of a micro-batch padded to its longest sample. Instead the micro-batch's
samples go to the dp ranks by longest-processing-time-first on their language cost (step/
balance.py `lpt`; the cost counts attention's quadratic term, as the encoder's does), and each
rank's samples are laid end to end in one packed row (or, under `max_tokens_per_micro_batch`,
a few rows of at most that many tokens; a longer sample has a row of its own). Each sample keeps
its own positions (restarting at 0), so the decoder's mask keeps attention inside it
(models/packing.py builds the row).

Samples stay in the micro-batch the samples cut puts them in (consecutive slices of the global
batch): the encoder passes, which cover consecutive micro-batches, and the loader's reading
stay as they are; only the split among the language dp ranks changes. Inside a rank, and inside
each row, samples keep ascending batch order: the boundary's destination order (boundary/
inputs.py: samples ascending, then positions) is then the order of the placeholders in the
flattened rows.

Pure and deterministic: a function of the samples' lengths alone (light samples will do), the
same on every rank without communication; O(n log n) in the samples of a micro-batch.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .balance import lpt

# Width of a language layer when the model's is not known (a pure plan without an adapter):
# only the ratio of the linear to the quadratic term matters for the assignment.
DEFAULT_HIDDEN, DEFAULT_FFN = 4096, 11008


def language_cost_of(hidden: int = DEFAULT_HIDDEN, ffn: int = DEFAULT_FFN) -> Callable[[int], int]:
    """tokens -> one decoder layer's work on a sample of that many tokens (attention over the
    sample itself: packing keeps it inside the sample). Causal attention does half the scores
    of full attention; the factor is common to every sample, so the full term is kept. The
    encoder's formula (models/item_cost.py `transformer_cost`) with the attention length the sample's."""
    return lambda tokens: tokens * (4 * hidden + 2 * ffn + 2 * tokens)


def assign_samples(lengths: Sequence[int], dp: int, cost: Callable[[int], int]) -> list[list[int]]:
    """Per dp rank: the indices (into `lengths`) of its samples, ascending. LPT on the cost; with
    at least `dp` samples of positive cost every rank gets one (the first `dp` go one to each)."""
    if len(lengths) < dp:
        raise ValueError(f"{len(lengths)} samples cannot give each of {dp} language dp ranks one")
    ranks = lpt([max(cost(n), 1) for n in lengths], dp)
    out: list[list[int]] = [[] for _ in range(dp)]
    for i, r in enumerate(ranks):
        out[r].append(i)
    return out


def cut_rows(lengths: Sequence[int], budget: int | None) -> list[list[int]]:
    """The packed rows of one rank's samples (indices into `lengths`, kept in order): one row, or
    under `budget` consecutive samples while they fit (next fit: order is the boundary's)."""
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


def pack_micro_batch(positions: Sequence[int], lengths: Sequence[int], dp: int, cost: Callable[[int], int],
                     budget: int | None = None) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per dp rank, its packed rows of batch positions: `out[d][r]` the positions in row r."""
    out = []
    for mine in assign_samples(lengths, dp, cost):
        rows = cut_rows([lengths[i] for i in mine], budget)
        out.append(tuple(tuple(positions[mine[i]] for i in row) for row in rows))
    return tuple(out)


def load_figures(rows: Sequence[Sequence[Sequence[int]]], lengths: Sequence[int], multiple: int = 1,
                 cost: Callable[[int], int] | None = None, packed: bool = True) -> dict[str, float]:
    """Real and computed tokens of one micro-batch's rows on every dp rank (`rows[d]` its rows of
    batch positions, `lengths[p]` sample p's tokens): rows are padded to the rank's longest,
    rounded up to `multiple`. `max_mean`: the slowest rank's work over the mean (1.0: balanced);
    a rank's work is its samples' costs and the linear cost of its padding when `packed`
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
    return {"real": real, "computed": computed, "max_mean": max(loads) / mean if mean else 1.0}
