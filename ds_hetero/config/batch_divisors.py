"""Which global batches every stage can split: one divisor per stage, and the error that names the one that binds.

Each stage splits the global batch its own way, so each has its own divisor:
- the language stage: dp x micro_batches (every dp rank takes the same number of samples in every
  micro-batch);
- an encoder balanced by "position": dp x its micro_batches, for the same reason;
- an encoder balanced by "tokens": only its micro_batches (its passes take whole samples; the images
  of a pass go to dp ranks by cost, so any dp fits).

A batch is valid when every divisor divides it. The error names the refusing stage whose divisor is
largest (the language stage on a tie: the encoders' limits are usually implied by it), and offers
balance "tokens" only to an encoder that is not already balanced by tokens.
"""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple

from ..errors import HeteroConfigError
from .schema import LANGUAGE


class Divisor(NamedTuple):
    stage: str
    value: int
    why: str  # the product, spelled out for the error
    balance: str | None  # an encoder's balance; None for the language stage


def stage_divisors(layouts: Mapping, micro_batches: int, encoder_mbs: Mapping[str, int],
                   balance_of: Mapping[str, str]) -> list[Divisor]:
    """One divisor per stage (see the module docstring)."""
    out = []
    for name, layout in layouts.items():
        mbs = encoder_mbs.get(name, micro_batches)
        if name == LANGUAGE:
            out.append(Divisor(name, layout.dp * mbs, f"dp x micro_batches = {layout.dp} x {mbs}", None))
        elif balance_of[name] == "tokens":
            out.append(Divisor(name, mbs, f"micro_batches = {mbs} (its encoder passes; balance \"tokens\" spreads "
                                          "each pass's images over its dp ranks, so its dp does not count)", "tokens"))
        else:
            out.append(Divisor(name, layout.dp * mbs, f"dp x micro_batches = {layout.dp} x {mbs}", "position"))
    return out


def check_global_batch(global_batch: int, divisors: list[Divisor]) -> None:
    """HeteroConfigError at train_batch_size naming the stage that refuses `global_batch`, if any does."""
    refusing = [d for d in divisors if global_batch % d.value]
    if not refusing:
        return
    binding = max(refusing, key=lambda d: (d.value, d.stage == LANGUAGE))
    every = math.lcm(*(d.value for d in divisors))
    below, above = (global_batch // every) * every, (global_batch // every + 1) * every
    nearest = f"{below} or {above}" if below else f"{above}"
    message = (f"{global_batch} is not divisible by stage {binding.stage!r} {binding.why} = {binding.value}; use a "
               f"multiple of {every} (e.g. {nearest})")
    if every != binding.value:
        message += (" (the least multiple of every stage's divisor: "
                    + ", ".join(f"{d.stage} {d.value}" for d in divisors) + ")")
    if binding.balance == "position":
        message += (f"; or balance \"tokens\" for stage {binding.stage!r} (hetero_parallel.stages.{binding.stage}.balance "
                    "or hetero_parallel.balance): it then needs only a multiple of its micro_batches, its images going to "
                    "dp ranks by cost")
    raise HeteroConfigError("train_batch_size", message)
