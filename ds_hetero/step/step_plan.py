"""StepPlan: everything one step's schedule needs to know, computed once, without communication.

    plan = StepPlan(config, adapter.encoders(), samples)

From the config and the batch alone (light samples will do: only `input_ids` are read) it
fixes, identically on every rank:
- the language micro-batches: which samples each language dp rank handles in each of them;
- per encoder stage, its passes (`stages.<name>.micro_batches`, default one per language
  micro-batch): the samples of each pass, which encoder dp rank encodes which item
  (step/balance.py, by position or balanced by cost), and the language micro-batches the
  pass's rows feed;
- the boundary inputs of every exchange (boundary/inputs.py), with the sequence positions of
  the placeholders when the language stage shards the sequence.

The schedules only execute a plan (schedule/). Nothing here names an encoder: the encoder
stages are whatever `EncoderPort`s the model's adapter declares (models/adapter.py).

Samples are cut as in a single process: the batch into `micro_batches` consecutive language
micro-batches; inside one, language dp rank d takes the d-th contiguous share. An encoder pass
covers `micro_batches / passes` consecutive language micro-batches, and its dp rank e encodes
the items `balance` gives it. Stages with different dp cut the same samples differently, which
is what the boundary reconciles.

With `language_batching` "packed" (step/packing.py) the global batch's samples go to (language
micro-batch, dp rank) bins by token cost and each bin's are packed into rows (`language_rows`): a
micro-batch is then any set of samples (`micro_batch_samples`, in the rows' order), and an encoder pass
covers the samples of the micro-batches it feeds, micro-batch after micro-batch (`EncoderPass.
samples`: the order the boundary delivers its rows in, so a language rank's rows of consecutive
micro-batches arrive one micro-batch after the other); the boundary then delivers each row to its
packed position. The samples cut's plan is unchanged (consecutive ranges).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

from ..boundary.inputs import BoundaryInputs, seq_lens, shard_bounds
from ..config import LANGUAGE, HeteroConfig
from ..context_parallel.sequence import image_positions, is_sharded, padded_length, padded_lengths
from .balance import EncoderAssignment, assign_pass
from .packing import batch_load, language_cost_of, pack_batch
from .shares import dp_share


@dataclass(frozen=True)
class EncoderPass:
    """One forward (and backward) of an encoder stage over a slice of the batch."""

    stage: str
    index: int
    assignment: EncoderAssignment  # its samples, items, and the dp rank encoding each item
    boundary: BoundaryInputs  # the exchange that takes its rows to the language stage
    feeds: range  # the language micro-batches its rows go to, in order

    @property
    def samples(self):
        """Its samples' batch positions in boundary order (the samples cut: a range)."""
        return self.assignment.samples

    @cached_property
    def _index(self) -> dict[int, int]:
        return {p: i for i, p in enumerate(self.samples)}

    def index_of(self, p: int) -> int:
        """Sample p's index in this pass (its entry in `boundary` and `assignment.token_counts`)."""
        if isinstance(self.samples, range):
            return p - self.samples.start
        return self._index[p]


class StepPlan:
    """The plan of one step (or one evaluation batch) over `samples`.

    micro_batches   language micro-batches (default: the config's); evaluation passes more
                    when it is given more samples, at the training micro-batch size
    per_micro_batch one encoder pass per language micro-batch (evaluation: no backward to
                    accumulate), whatever `stages.<name>.micro_batches` says
    language_cost   tokens -> the language stage's work on one sample (packed batching: the
                    model adapter's `language_cost`; default step/packing.py's)
    dense_attention whether the language stage's attention scores a packed row's whole L x L
                    (sdpa or eager under `packed_attention` "row_mask": the adapter's
                    `dense_rows`): its packed rows are then cut to cost least (step/rows.py),
                    and priced as padded rows
    """

    def __init__(self, config: HeteroConfig, ports: Mapping[str, Any], samples: Sequence[dict[str, Any]],
                 micro_batches: int | None = None, per_micro_batch: bool = False,
                 language_cost: Callable[[int], int] | None = None, dense_attention: bool = False):
        self.config = config
        self.micro_batches = micro_batches or config.micro_batches
        self.micro_batch_size = len(samples) // self.micro_batches  # samples of one language micro-batch
        if self.micro_batch_size * self.micro_batches != len(samples) or not self.micro_batch_size:
            raise ValueError(f"{len(samples)} samples do not cut into {self.micro_batches} equal micro-batches")
        language = config.stages[LANGUAGE]
        self.language_share = self.micro_batch_size // language.dp  # samples per language dp rank
        self.packed = config.packed
        self.dense_attention = dense_attention
        self._rows, self._language_dp, self._micro_batch_of = (), {}, {}
        self._lengths = [int(s["input_ids"].numel()) for s in samples]
        self._language_cost = language_cost or language_cost_of()
        if self.packed:  # every sample to a (micro-batch, dp rank) bin, across micro-batches
            self._rows = pack_batch(self._lengths, self.micro_batches, language.dp, self._language_cost,
                                    config.max_tokens_per_micro_batch, dense_attention, padded_length(1, language))
            for m, per_mb in enumerate(self._rows):
                for d, rows in enumerate(per_mb):
                    for p in (p for row in rows for p in row):
                        self._language_dp[p], self._micro_batch_of[p] = d, m
        self.passes: dict[str, tuple[EncoderPass, ...]] = {}
        for name, port in ports.items():
            n = self.micro_batches if per_micro_batch else config.micro_batches_of(name)
            self.passes[name] = tuple(self._encoder_pass(name, port, samples, v, n) for v in range(n))

    # ------------------------------------------------------------------ language
    def micro_batch_samples(self, m: int) -> Sequence[int]:
        """Batch positions of language micro-batch m, all dp ranks together: the samples cut's
        range; packed, dp rank after dp rank, each rank's rows after one another (the boundary
        delivers a rank's rows in this order, that of the placeholders in its flattened rows)."""
        if self.packed:
            return tuple(p for rows in self._rows[m] for row in rows for p in row)
        return dp_share(m, self.micro_batch_size, 1, 0)

    def language_samples(self, dp: int, m: int) -> Sequence[int]:
        """Batch positions language dp rank `dp` handles in micro-batch m: ascending, or packed in
        the order of its rows (each row's ascending; a dense kernel's rows may interleave)."""
        if self.packed:
            return tuple(p for row in self._rows[m][dp] for p in row)
        return dp_share(m, self.micro_batch_size, self.config.stages[LANGUAGE].dp, dp)

    def language_rows(self, dp: int, m: int) -> tuple[tuple[int, ...], ...]:
        """The rows of language dp rank `dp`'s micro-batch m: batch positions per row (a packed
        row per rank, or a few under the token budget; with the samples cut one sample a row)."""
        if self.packed:
            return self._rows[m][dp]
        return tuple((p,) for p in self.language_samples(dp, m))

    def language_load(self) -> dict[str, float]:
        """The language stage's tokens this step: `real` (the samples'), `computed` (every dp
        rank's rows padded to its longest, rounded up to the shard count; all ranks together),
        `max_mean` (the slowest dp rank's language cost over the mean, worst micro-batch) and
        `step_max_mean` (the slowest ranks' costs summed over the micro-batches over the means':
        the step's time over a balanced step's, step/packing.py `step_max_mean`)."""
        language = self.config.stages[LANGUAGE]
        per_mb = [[self.language_rows(d, m) for d in range(language.dp)] for m in range(self.micro_batches)]
        # a dense kernel scores each padded row whole, packed or not
        return batch_load(per_mb, self._lengths, padded_length(1, language), self._language_cost,
                          self.packed and not self.dense_attention)

    def language_dp_of(self, p: int) -> int:
        """The language dp rank that consumes sample p."""
        if self.packed:
            return self._language_dp[p]
        return (p % self.micro_batch_size) // self.language_share

    def language_positions(self, dp: int) -> set[int]:
        return {p for m in range(self.micro_batches) for p in self.language_samples(dp, m)}

    def language_scale(self) -> float:
        """What the language loss sum is multiplied by before `backward` (after dividing by the
        global label count): DeepSpeed divides by gradient_accumulation_steps and averages over
        dp, so this makes the gradient that of the single-process loss."""
        return self.config.stages[LANGUAGE].dp * self.micro_batches

    # ------------------------------------------------------------------ encoders
    def encoder_pass(self, stage: str, v: int) -> EncoderPass:
        return self.passes[stage][v]

    def pass_feeding(self, stage: str, m: int) -> EncoderPass:
        """The pass of `stage` whose rows language micro-batch m takes."""
        passes = self.passes[stage]
        return passes[m // (self.micro_batches // len(passes))]

    def encoder_items(self, stage: str, v: int, dp: int) -> list[tuple[int, list[int]]]:
        """(sample position, its item indices) that dp rank `dp` of `stage` encodes in pass v."""
        return self.passes[stage][v].assignment.images_of(dp)

    def encoder_positions(self, stage: str, dp: int) -> set[int]:
        """Positions of the samples whose items dp rank `dp` of `stage` encodes this step."""
        return {p for v in range(len(self.passes[stage])) for p, _ in self.encoder_items(stage, v, dp)}

    def item_rows(self, n_samples: int) -> list[tuple[tuple[int, ...], ...]]:
        """Per sample, per encoder stage (in the ports' order), the boundary rows of each of its
        items: what `port.rows` gave when the plan was built, so the batch agreement digests the
        same values without reading every sample's token ids again (O(items))."""
        out = [[[] for _ in self.passes] for _ in range(n_samples)]
        for j, passes in enumerate(self.passes.values()):
            for p_ in passes:  # the passes of a stage cover the batch once, items in (sample, item) order
                for image in p_.assignment.images:
                    out[image.sample][j].append(image.rows)
        return [tuple(tuple(rows) for rows in per_port) for per_port in out]

    @property
    def lengths(self) -> list[int]:
        """Every sample's language tokens, in batch order."""
        return self._lengths

    def items_by_encoder(self) -> dict[str, list[int]]:
        """Per encoder stage, the boundary rows of each of its items in the step (O(items))."""
        return {name: [image.rows for p_ in passes for image in p_.assignment.images]
                for name, passes in self.passes.items()}

    def idle_encoders(self) -> frozenset[str]:
        """The encoder stages with no item in the whole step (a text-only batch's vision stage):
        one process would leave their parameters without a gradient (optimizer_step/idle_stages.py)."""
        return frozenset(name for name, passes in self.passes.items()
                         if not any(p_.assignment.images for p_ in passes))

    def encoder_scale(self, stage: str) -> float:
        """The factor of the encoder's surrogate loss `sum(rows * row_grad)`: the row gradients
        carry the language stage's dp factor (language_scale), the encoder engine divides by its
        own passes and averages over its own dp."""
        return self.config.stages[stage].dp * len(self.passes[stage]) / self.config.stages[LANGUAGE].dp

    def _encoder_pass(self, name: str, port, samples, v: int, n: int) -> EncoderPass:
        cfg = self.config
        per = self.micro_batches // n
        feeds = range(v * per, (v + 1) * per)
        if self.packed:  # the samples of the micro-batches it feeds, micro-batch after micro-batch
            positions = tuple(p for m in feeds for p in self.micro_batch_samples(m))
        else:
            positions = dp_share(v, self.micro_batch_size * per, 1, 0)
        size = len(positions)
        dp = cfg.stages[name].dp
        a = assign_pass(samples, positions, dp, cfg.balance_of(name), port)
        inputs = BoundaryInputs(
            token_counts=a.token_counts,
            src_dp=a.src_dp([i * dp // size for i in range(size)]),  # samples without items: any rank
            dst_dp=[self.language_dp_of(p) for p in positions],
        )
        language = cfg.stages[LANGUAGE]
        if is_sharded(language) and self.packed:  # positions inside the packed rows
            inputs = dataclasses.replace(inputs, **self._packed_positions(samples, positions, port))
        elif is_sharded(language):  # each language rank takes the rows of its sequence shard only
            mine = [samples[p] for p in positions]
            # a sample is padded to the longest of its dp replica's share of its own micro-batch
            # (a pass may feed several micro-batches)
            replica = [(p // self.micro_batch_size, d) for p, d in zip(positions, inputs.dst_dp)]
            inputs = dataclasses.replace(inputs, positions=image_positions(mine, port.ids),
                                         seq_len=padded_lengths(mine, replica, language))
        return EncoderPass(name, v, a, inputs, feeds)

    def _packed_positions(self, samples, positions, port) -> dict[str, list]:
        """Boundary positions and seq_len of the samples at `positions` in their packed rows: a
        sample's placeholders sit at its offset in its row, and every row of a rank's micro-batch
        is padded to the rank's longest row, a multiple of the shard count."""
        language = self.config.stages[LANGUAGE]
        where: dict[int, tuple[int, int]] = {}  # position -> (offset in its row, row length)
        for p in positions:
            if p in where:
                continue
            rows = self._rows[self._micro_batch_of[p]][self._language_dp[p]]
            length = padded_length(max(sum(int(samples[q]["input_ids"].numel()) for q in row) for row in rows),
                                   language)
            for row in rows:
                offset = 0
                for q in row:
                    where[q] = (offset, length)
                    offset += int(samples[q]["input_ids"].numel())
        own = image_positions([samples[p] for p in positions], port.ids)
        return {"positions": [[where[p][0] + j for j in js] for p, js in zip(positions, own)],
                "seq_len": [where[p][1] for p in positions]}

    def rows_of(self, stage: str, dp: int, m: int, rank: int | None = None) -> int:
        """Boundary rows of `stage` that language dp rank `dp` consumes in micro-batch m; with a
        sharded sequence, those of global `rank`'s shard (the rows it receives: the positions of
        the placeholders in its shard of each sample's padded sequence)."""
        p_ = self.pass_feeding(stage, m)
        counts = p_.assignment.token_counts
        language = self.config.stages[LANGUAGE]
        if rank is None or not is_sharded(language):
            return sum(counts[p_.index_of(p)] for p in self.language_samples(dp, m))
        lens = seq_lens(p_.boundary)
        total = 0
        for p in self.language_samples(dp, m):
            i = p_.index_of(p)
            start, stop = shard_bounds(language, rank, lens[i])
            total += sum(start <= q < stop for q in p_.boundary.positions[i])
        return total
