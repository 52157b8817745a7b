"""Which encoder dp rank encodes which image: balanced by the encoder's cost, at image granularity.

The vision stage's work per image grows with its patches (linear layers) and with the square of
its attention length (CLIP attends over the whole image, Qwen2-VL's vision blocks over each
frame). Giving each dp rank the images of fixed sample positions ("position") lets one rank
encode many times the tokens of another, and every rank waits for it. The boundary routes any
row from any source replica, so the encoder may take any images: "tokens" assigns the images of
an encoder micro-batch to the dp ranks by longest-processing-time-first (LPT) on their cost.

Pure and deterministic: a function of the samples' `input_ids` alone (every rank has them, light
samples included), identical on every rank without communication. Ties break by image order and
then by the lowest rank. "tokens" keeps the position assignment when that one is at least as
balanced (its slowest rank no slower), so it is never worse than "position".

    image      one image of one sample; `rows` boundary rows (image tokens after the projector or
               merger), `cost` the encoder's work (models/item_cost.py `transformer_cost`)
    source     rows on a rank in ascending global order (ds_hetero/boundary/inputs.py): a rank
               encodes its images in (sample, image) order, and a sample whose images sit on
               several ranks becomes `(rows, dp)` runs in BoundaryInputs.src_dp
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Sequence

from ..config.schema import BALANCES


@dataclass(frozen=True)
class Image:
    sample: int  # position in the global batch
    index: int   # the sample's k-th image (its order in pixel_values / image_grid_thw)
    rows: int    # boundary rows it produces
    cost: int    # encoder work (transformer_cost)


def lpt(costs: Sequence[int], n: int) -> list[int]:
    """Longest processing time first: each item, largest cost first (ties: earlier item), goes
    to the least loaded rank (ties: the lowest rank). Greedy list scheduling bounds the largest
    load by mean + max(cost); LPT's by 4/3 of the optimum."""
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    heap = [(0, r) for r in range(n)]
    out = [0] * len(costs)
    for i in order:
        load, r = heapq.heappop(heap)
        out[i] = r
        heapq.heappush(heap, (load + costs[i], r))
    return out


def loads(costs: Sequence[int], ranks: Sequence[int], n: int) -> list[int]:
    out = [0] * n
    for c, r in zip(costs, ranks):
        out[r] += c
    return out


@dataclass(frozen=True)
class EncoderAssignment:
    """The images of one encoder micro-batch and the dp rank of each.

    samples       global-batch positions of the micro-batch, in source order (the samples cut:
                  a range; packed language batching: its micro-batches' samples, step/step_plan.py)
    images        every image of those samples, in (sample, image) order
    rank          the dp rank encoding each image
    token_counts  boundary rows per sample (its images' rows together)
    """

    samples: Sequence[int]
    images: tuple[Image, ...]
    rank: tuple[int, ...]
    token_counts: tuple[int, ...]
    dp: int

    def images_of(self, dp: int) -> list[tuple[int, list[int]]]:
        """(sample position, its image indices) that rank `dp` encodes, in source order."""
        out: list[tuple[int, list[int]]] = []
        for image, r in zip(self.images, self.rank):
            if r != dp:
                continue
            if out and out[-1][0] == image.sample:
                out[-1][1].append(image.index)
            else:
                out.append((image.sample, [image.index]))
        return out

    def src_dp(self, default: Sequence[int]) -> list[int | tuple[tuple[int, int], ...]]:
        """BoundaryInputs.src_dp: a rank per sample held whole, `(rows, dp)` runs for a split one.

        `default[i]` is the rank of a sample without images (no rows: any rank is right).
        """
        runs: dict[int, list[list[int]]] = {p: [] for p in self.samples}
        for image, r in zip(self.images, self.rank):
            mine = runs[image.sample]
            if mine and mine[-1][1] == r:
                mine[-1][0] += image.rows
            elif image.rows:
                mine.append([image.rows, r])
        out: list[int | tuple[tuple[int, int], ...]] = []
        for i, p in enumerate(self.samples):
            if not runs[p]:
                out.append(default[i])
            elif len(runs[p]) == 1:
                out.append(runs[p][0][1])
            else:
                out.append(tuple((n, r) for n, r in runs[p]))
        return out

    def loads(self, what: str = "cost") -> list[int]:
        """Per dp rank: the encoder cost ("cost") or the boundary rows ("rows") it encodes."""
        return loads([getattr(i, what) for i in self.images], self.rank, self.dp)

    def imbalance(self, what: str = "cost") -> float:
        """max / mean over dp ranks (1.0: perfectly balanced; 1.0 too without any image)."""
        per_rank = self.loads(what)
        total = sum(per_rank)
        return max(per_rank) * self.dp / total if total else 1.0


def assign_images(images: Sequence[Image], position_rank: Sequence[int], dp: int, balance: str) -> tuple[int, ...]:
    """The dp rank of every image: by position (`position_rank`, its sample's share) or by cost."""
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")
    position_rank = tuple(position_rank)
    if balance == "position" or dp == 1:
        return position_rank
    costs = [i.cost for i in images]
    balanced = tuple(lpt(costs, dp))
    # Never worse than position: keep it when its slowest rank is no slower (fewer split samples).
    if max(loads(costs, position_rank, dp), default=0) <= max(loads(costs, balanced, dp), default=0):
        return position_rank
    return balanced


def assign_pass(samples: Sequence[dict[str, Any]], positions: Sequence[int], dp: int, balance: str, port
                ) -> EncoderAssignment:
    """The assignment of one encoder pass over the samples at `positions`, to `dp` ranks.

    `port` is the encoder's EncoderPort (models/adapter.py): `rows(sample)` gives the boundary
    rows of each of the sample's items (images, video clips, audio clips), `item_costs(sample)` the
    encoder's work for each.
    """
    images, position_rank, counts = [], [], []
    for offset, p in enumerate(positions):
        rows = port.rows(samples[p])
        counts.append(sum(rows))
        for k, (n, cost) in enumerate(zip(rows, port.item_costs(samples[p]), strict=True)):
            images.append(Image(p, k, n, cost))
            # the sample's contiguous share (offset // (samples / dp) when dp divides them; with
            # more dp ranks than samples, balance "tokens", some ranks get no sample by position)
            position_rank.append(offset * dp // len(positions))
    rank = assign_images(images, position_rank, dp, balance)
    return EncoderAssignment(positions, tuple(images), rank, tuple(counts), dp)


def encoder_assignment(cfg, adapter, samples: Sequence[dict[str, Any]], stage: str, micro_batch: int,
                       micro_batches: int | None = None) -> EncoderAssignment:
    """The assignment of encoder micro-batch `micro_batch` of `stage`, the batch cut into
    `micro_batches` (default: the stage's own) consecutive micro-batches; the config's balance."""
    size = cfg.global_batch_size // (micro_batches or cfg.micro_batches_of(stage))
    positions = range(micro_batch * size, (micro_batch + 1) * size)
    return assign_pass(samples, positions, cfg.stages[stage].dp, cfg.balance, adapter.encoders()[stage])
