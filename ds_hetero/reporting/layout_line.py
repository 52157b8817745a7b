"""One line that says the whole layout a job runs: every stage's axes and memory options, the
placement, the batching and where the data comes from.

    layout: colocated | vision tp1 cp1 dp4 pp1 ep1 ZeRO 1 freeze no recompute no | language tp2 cp1 dp2
    pp1 ep1 ZeRO 1 freeze no recompute no | batch 16 in 2 micro-batches, samples | data synthetic, 4096 samples

The same text in `ds-hetero validate`, the main job's header and summary, and the Trainer's first log,
so a person compares runs by one line. Every axis is printed even at size 1: an absent `ep` reads the
same as a forgotten one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config.schema import HeteroConfig


@dataclass(frozen=True)
class DataSource:
    """Where the training rows come from: `file` None for a dataset built in memory (`kind` says which:
    "synthetic" for the recipes' shapes task). `rows_used` counts the rows the run can draw;
    `rows_skipped` the bad rows left out (--skip-bad-rows)."""

    file: str | None = None
    rows_used: int | None = None
    rows_skipped: int = 0
    kind: str = "synthetic"

    def describe(self) -> str:
        if self.file is None:
            return self.kind + (f", {self.rows_used} samples" if self.rows_used is not None else "")
        if self.rows_used is None:  # not indexed yet (before initialize)
            return self.file
        read = self.rows_used + self.rows_skipped
        return f"{self.file}, {read} rows read, {self.rows_skipped} skipped"


def data_source(dataset: Any, file: str | None = None, kind: str = "synthetic") -> DataSource:
    """The DataSource of a dataset: its length, and its skipped rows where it keeps them (SFTDataset,
    after `initialize` measured its length index)."""
    try:
        used = len(dataset)
    except TypeError:  # an iterable without a length
        used = None
    skipped = getattr(dataset, "skipped", None) if file is not None else None
    return DataSource(file, used, len(skipped) if skipped else 0, kind)


def stage_text(cfg: HeteroConfig, name: str) -> str:
    """`vision tp1 cp1 dp4 pp1 ep1 ZeRO 1 freeze no recompute no` (+ `sp` with sequence parallelism)."""
    layout, options = cfg.stages[name], cfg.options_of(name)
    axes = f"{name} tp{layout.tp} cp{layout.cp} dp{layout.dp} pp{layout.pp} ep{layout.ep}"
    if layout.sequence_parallel:
        axes += " sp"
    if cfg.placement != "colocated":  # stages on their own ranks: which ones
        axes += f" ranks {rank_ranges(layout.ranks)}"
    zero = 0 if options.frozen else cfg.zero_stage_of(name)  # a frozen stage has no optimizer to shard
    freeze = "all" if options.freeze is True else ",".join(options.freeze) if options.freeze else "no"
    recompute = ("all" if options.recompute < 0 else f"{options.recompute} layers") if options.recompute else "no"
    return f"{axes} ZeRO {zero} freeze {freeze} recompute {recompute}"


def rank_ranges(ranks: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> "0-2,5", in the stage's own order."""
    parts: list[list[int]] = []
    for r in ranks:
        if parts and r == parts[-1][-1] + 1:
            parts[-1].append(r)
        else:
            parts.append([r])
    return ",".join(str(p[0]) if len(p) == 1 else f"{p[0]}-{p[-1]}" for p in parts)


def batching_text(cfg: HeteroConfig) -> str:
    """`batch 16 in 2 micro-batches, samples` or `..., packed (max 512 tokens per row)`."""
    text = f"batch {cfg.global_batch_size} in {cfg.micro_batches} micro-batches, {cfg.language_batching}"
    if cfg.packed and cfg.max_tokens_per_micro_batch:
        text += f" (max {cfg.max_tokens_per_micro_batch} tokens per row)"
    return text


def layout_line(cfg: HeteroConfig, data: DataSource | None = None) -> str:
    """The line; without `data` it ends at the batching (validate knows no dataset)."""
    parts = [cfg.placement] + [stage_text(cfg, name) for name in cfg.stages] + [batching_text(cfg)]
    if data is not None:
        parts.append(f"data {data.describe()}")
    return "layout: " + " | ".join(parts)
