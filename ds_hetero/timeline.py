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
from collections import deque
from dataclasses import dataclass
from typing import Iterator

COMPUTE = ("forward", "backward", "optimizer")


@dataclass
class Counter:
    """Values of one step drawn as a counter track (TFLOP/s per device, MFU)."""

    name: str
    time: float  # time.time() at the step's end
    step: int
    values: dict[str, float]


@dataclass
class Span:
    name: str  # e.g. "vision.forward[m=1]"
    category: str  # forward | backward | boundary | optimizer
    start: float  # seconds, time.time() clock (shared by processes on one machine)
    end: float
    step: int


class Timeline:
    """Collects this rank's spans; one instance per engine.

    Memory stays bounded however long the run: per-step figures read only the spans of the
    steps still open (the last two), and `spans`, the window a Chrome trace shows, keeps the
    last `trace_window` spans (set it before the run; 0 keeps none).

    `synchronize`: wait for the device at every span's end, so a span times the work and not
    its launch. Off by default: a full device synchronize serialises what the GPU would overlap
    (ZeRO-2's gradient reduction with the backward), so only traces and profiling turn it on.
    Off, spans measure host time (on a CPU, the same thing).
    """

    def __init__(self, trace_window: int = 100_000, synchronize: bool = False):
        self.spans: deque[Span] = deque(maxlen=trace_window)
        self.counters: deque[Counter] = deque(maxlen=trace_window)
        self._by_step: dict[int, list[Span]] = {}
        self.synchronize = synchronize

    @property
    def trace_window(self) -> int:
        return self.spans.maxlen

    @trace_window.setter
    def trace_window(self, n: int) -> None:
        self.spans = deque(self.spans, maxlen=n)
        self.counters = deque(self.counters, maxlen=n)

    @contextlib.contextmanager
    def span(self, name: str, category: str, step: int) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            if self.synchronize:
                _device_synchronize()
            self.add(Span(name, category, start, time.time(), step))

    def count(self, name: str, step: int, values: dict[str, float]) -> None:
        """A step's values for a counter track of the trace (the engine: its TFLOP/s and MFU)."""
        if values:
            self.counters.append(Counter(name, time.time(), step, dict(values)))

    def add(self, span: Span) -> None:
        self.spans.append(span)
        if span.step not in self._by_step:
            for old in [k for k in self._by_step if k < span.step - 1]:
                del self._by_step[old]
            self._by_step[span.step] = []
        self._by_step[span.step].append(span)

    def step_spans(self, step: int) -> list[Span]:
        """The spans of `step`, if it is one of the last two steps recorded (else [])."""
        return self._by_step.get(step, [])

    def step_busy(self, step: int) -> float:
        return sum(s.end - s.start for s in self.step_spans(step) if s.category in COMPUTE)

    def step_stage_time(self, step: int) -> dict[str, dict[str, float]]:
        """Seconds per stage and phase in `step`, e.g. {"vision": {"forward": .., "backward": ..}}."""
        out: dict[str, dict[str, float]] = {}
        for s in self.step_spans(step):
            stage, _, phase = s.name.partition(".")
            phase = phase.split("[")[0] or s.category
            out.setdefault(stage, {}).setdefault(phase, 0.0)
            out[stage][phase] += s.end - s.start
        return out


def _device_synchronize() -> None:
    from deepspeed.accelerator import get_accelerator

    get_accelerator().synchronize()  # a no-op on the CPU accelerator


def bubble_fraction(busy: float, step_time: float) -> float:
    return max(0.0, 1.0 - busy / step_time) if step_time > 0 else 0.0


def chrome_trace(spans_per_rank: list[list[Span]], counters_per_rank: list[list[Counter]] | None = None) -> dict:
    """Trace Event Format: complete events ("ph": "X"), microseconds, one tid per rank; each rank's
    counters (`Timeline.count`) as counter events ("ph": "C"), one track per name and rank."""
    t0 = min((s.start for spans in spans_per_rank for s in spans), default=0.0)
    events = []
    for rank, counters in enumerate(counters_per_rank or []):
        for c in counters:
            events.append({"name": f"{c.name} (rank {rank})", "ph": "C", "pid": 0, "tid": rank,
                           "ts": round((c.time - t0) * 1e6, 1), "args": c.values})
    for rank, spans in enumerate(spans_per_rank):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank, "args": {"name": f"rank {rank}"}})
        for s in spans:
            events.append({
                "name": s.name, "cat": s.category, "ph": "X", "pid": 0, "tid": rank,
                "ts": round((s.start - t0) * 1e6, 1), "dur": round((s.end - s.start) * 1e6, 1),
                "args": {"step": s.step},
            })
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def pipeline_overlap(spans_per_rank: list[list[Span]], step: int) -> list[dict[str, float]]:
    """Per rank, in one step: where its time went around a pipelined language stage.

    encoder_s            the rank's encoder forward and backward time
    language_s           the rank's language (pipeline stage) forward and backward time
    pipeline_wait_s      time blocked on a pipeline neighbour (fill, drain, stragglers)
    encoder_in_pipeline_s  encoder time inside the pipeline's window (from the first language
                         forward to the last language backward on any rank): encoder work that
                         ran while some pipeline stage was filling or draining
    """
    mine = [[s for s in spans if s.step == step] for spans in spans_per_rank]
    language = [s for spans in mine for s in spans if s.name.startswith("language.")]
    lo = min((s.start for s in language), default=0.0)
    hi = max((s.end for s in language), default=0.0)
    out = []
    for spans in mine:
        encoder = [s for s in spans if s.category in ("forward", "backward") and not s.name.startswith("language.")]
        out.append({
            "encoder_s": sum(s.end - s.start for s in encoder),
            "language_s": sum(s.end - s.start for s in spans if s.name.startswith("language.")),
            "pipeline_wait_s": sum(s.end - s.start for s in spans if s.category == "pipeline"),
            "encoder_in_pipeline_s": sum(max(0.0, min(s.end, hi) - max(s.start, lo)) for s in encoder),
        })
    return out
