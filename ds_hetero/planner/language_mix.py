"""The language stage's work on a length mix, as the runtime cuts it (pure).

Without a length mix (`Workload.lengths` empty) every sample is `seq_len` tokens and a language dp
rank's micro-batch is `samples` rows of that length: the planner's formulas (flops.py,
activations.py, collectives.py) take (samples, seq_len). With one, each language dp rank's
samples and rows come from the runtime's own functions (step/shares.py `dp_share` for the samples
cut, step/packing.py `pack_batch` for "packed": the whole batch to (micro-batch, dp rank) bins, as
the StepPlan assigns it, across micro-batches; the cost step/packing.py's
`language_cost_of` with the model's widths, as the adapter's `language_cost`), so the plan's
padded tokens and max/mean are the StepPlan's on the same samples (tests/planner/
test_planner_lengths.py).

A rank's work is then priced as an equivalent uniform micro-batch: its computed tokens T (rows
padded to its longest, rounded up to the shard count) and its attention term A (the sum of the
squared lengths attention spans: each padded row's length with the samples cut, each sample's own
with packing under a varlen kernel, and under a dense one (sdpa, eager: `Workload.dense`) each of
the runtime's dense rows (step/rows.py) padded and whole; padding in a varlen packed row costs its
linear work only, as in `load_figures`) give
seq_len A / T and samples T^2 / A, which the formulas turn back into T tokens and A score
entries. Time: the slowest rank over the step (every rank waits for it at the gradient reduction),
as a mean micro-batch; memory: the largest micro-batch of any rank. A uniform mix gives back
(samples, seq_len) exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ..boundary.inputs import num_shards
from ..layout import StageLayout
from ..models.shapes import ModelSpec
from ..step.packing import batch_load, language_cost_of, pack_batch
from ..step.shares import dp_share
from .workload import Workload

BATCHINGS = ("samples", "packed")


@dataclass(frozen=True)
class RankWork:
    """One language dp rank's micro-batch: computed tokens, attention term, real tokens."""

    tokens: int
    attention: int
    real: int


def batch_rows(lengths: Sequence[int], micro_batches: int, dp: int, packed: bool, cost,
               budget: int | None, dense: bool = False, multiple: int = 1
               ) -> list[list[tuple[tuple[int, ...], ...]]]:
    """`out[m][d]`: dp rank d's rows (batch positions) in micro-batch m: StepPlan.language_rows
    (`dense`: a dense attention kernel's rows, padded to a multiple of `multiple`)."""
    if packed:
        return [list(per_mb) for per_mb in pack_batch(lengths, micro_batches, dp, cost, budget, dense, multiple)]
    size = len(lengths) // micro_batches
    return [[tuple((p,) for p in dp_share(m, size, dp, d)) for d in range(dp)] for m in range(micro_batches)]


def rank_work(rows: Sequence[Sequence[int]], lengths: Sequence[int], multiple: int, per_sample: bool) -> RankWork:
    """`per_sample`: attention spans each sample (packed rows under a varlen kernel), else each padded row."""
    longest = max(sum(lengths[p] for p in row) for row in rows)
    longest = -(-longest // multiple) * multiple
    real = sum(lengths[p] for row in rows for p in row)
    attention = sum(lengths[p] ** 2 for row in rows for p in row) if per_sample else longest ** 2 * len(rows)
    return RankWork(longest * len(rows), attention, real)


def step_work(lengths: tuple[int, ...], dp: int, micro_batches: int, multiple: int, packed: bool,
              budget: int | None, hidden: int, ffn: int, dense: bool = False) -> tuple[tuple[RankWork, ...], ...]:
    """`out[m][d]`: dp rank d's work in micro-batch m."""
    cost = language_cost_of(hidden, ffn)
    return tuple(tuple(rank_work(r, lengths, multiple, packed and not dense) for r in per_mb)
                 for per_mb in batch_rows(lengths, micro_batches, dp, packed, cost, budget, dense, multiple))


def language_load(lengths: Sequence[int], dp: int, micro_batches: int, multiple: int, packed: bool,
                  budget: int | None, hidden: int, ffn: int, dense: bool = False) -> dict[str, float]:
    """`real`, `computed` tokens, `max_mean` (worst micro-batch) and `step_max_mean` of a step:
    StepPlan.language_load's figures, from the same rows and `batch_load`."""
    cost = language_cost_of(hidden, ffn)
    rows = batch_rows(lengths, micro_batches, dp, packed, cost, budget, dense, multiple)
    return batch_load(rows, lengths, multiple, cost, packed and not dense)


def equivalent(tokens: float, attention: float) -> tuple[float, float]:
    """(samples, seq_len) of a uniform micro-batch with `tokens` tokens and `attention` score
    entries per head; integers when they are (a uniform mix gives the planner's own numbers)."""
    seq = attention / tokens
    samples = tokens / seq
    return (int(samples) if float(samples).is_integer() else samples), (int(seq) if float(seq).is_integer() else seq)


def slowest_rank(works: tuple[tuple[RankWork, ...], ...], hidden: int, ffn: int) -> tuple[float, float]:
    """(tokens, attention) per micro-batch of the rank whose step costs most (mean over its micro-batches)."""
    dp, n = len(works[0]), len(works)
    linear = 4 * hidden + 2 * ffn
    totals = [(sum(w[d].tokens for w in works), sum(w[d].attention for w in works)) for d in range(dp)]
    t, a = max(totals, key=lambda x: x[0] * linear + 2 * x[1])
    return t / n, a / n


def largest_micro_batch(works: tuple[tuple[RankWork, ...], ...]) -> tuple[int, int]:
    """(tokens, attention) of the largest micro-batch any rank holds (activations: tokens first)."""
    w = max((w for per in works for w in per), key=lambda w: (w.tokens, w.attention))
    return w.tokens, w.attention


def shards(layout) -> int:
    """Sequence chunks of a planner layout (StageChoice): the runtime's `num_shards` of its StageLayout."""
    return num_shards(StageLayout("language", layout.tp, layout.cp, layout.dp,
                                  tuple(range(layout.tp * layout.cp * layout.dp)),
                                  sequence_parallel=layout.sequence_parallel))


def language_shape(spec: ModelSpec, wl: Workload, layout, micro_batches: int, peak: bool = False
                   ) -> tuple[float, Workload]:
    """(samples, workload) the language formulas price one micro-batch of a dp rank of `layout` with:
    the slowest rank's mean micro-batch (time) or the largest micro-batch (`peak`: memory)."""
    lm = spec.language
    key = (wl.lengths[:wl.global_batch], layout.dp, micro_batches, shards(layout), wl.batching == "packed",
           wl.budget, lm.hidden, lm.ffn, wl.dense)
    works = wl.memo.get(key)
    if works is None:  # the search prices each layout many times: cut the mix once per layout
        works = wl.memo[key] = step_work(*key)
    t, a = largest_micro_batch(works) if peak else slowest_rank(works, lm.hidden, lm.ffn)
    samples, seq = equivalent(t, a)
    return samples, replace(wl, seq_len=seq)


def whole_batch(wl: Workload) -> tuple[float, Workload]:
    """(samples, workload) of the whole batch's real tokens (the model FLOPs of a step: no padding)."""
    lengths = wl.lengths[:wl.global_batch]
    samples, seq = equivalent(sum(lengths), sum(n * n for n in lengths))
    return samples, replace(wl, seq_len=seq)
