"""Per-rank timeline of one training run: spans of work, busy and idle time, Chrome traces.

A span is one piece of this rank's work (a stage's forward or backward, a boundary exchange, an
optimizer step). Busy time is the time inside compute spans; the rest of a step (waiting in a
boundary exchange for the other stage, start-up of the pipeline) is idle, and
`bubble = idle / step time`. Boundary exchanges count as communication, not busy: in the
disaggregated schedule that is where a rank waits for the other stage.

`chrome_trace(spans_per_rank)` gives the JSON that chrome://tracing and Perfetto open: one
track (tid) per rank.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Iterator

COMPUTE = ("forward", "backward", "optimizer")


@dataclass
class Span:
    name: str  # e.g. "vision.forward[m=1]"
    category: str  # forward | backward | boundary | optimizer
    start: float  # seconds, time.time() clock (shared by processes on one machine)
    end: float
    step: int


@dataclass
class Timeline:
    """Collects this rank's spans; one instance per engine."""

    spans: list[Span] = field(default_factory=list)
    keep: int = 100_000  # bound the memory of a long run; traces are for short runs

    @contextlib.contextmanager
    def span(self, name: str, category: str, step: int) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            if len(self.spans) < self.keep:
                self.spans.append(Span(name, category, start, time.time(), step))

    def step_busy(self, step: int) -> float:
        return sum(s.end - s.start for s in self.spans if s.step == step and s.category in COMPUTE)


def bubble_fraction(busy: float, step_time: float) -> float:
    return max(0.0, 1.0 - busy / step_time) if step_time > 0 else 0.0


def chrome_trace(spans_per_rank: list[list[Span]]) -> dict:
    """Trace Event Format: complete events ("ph": "X"), microseconds, one tid per rank."""
    t0 = min((s.start for spans in spans_per_rank for s in spans), default=0.0)
    events = []
    for rank, spans in enumerate(spans_per_rank):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank, "args": {"name": f"rank {rank}"}})
        for s in spans:
            events.append({
                "name": s.name, "cat": s.category, "ph": "X", "pid": 0, "tid": rank,
                "ts": round((s.start - t0) * 1e6, 1), "dur": round((s.end - s.start) * 1e6, 1),
                "args": {"step": s.step},
            })
    return {"traceEvents": events, "displayTimeUnit": "ms"}
