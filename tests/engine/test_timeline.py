"""Timeline spans, busy/idle accounting and the Chrome trace format."""

import json

from ds_hetero.timeline import Counter, Span, Timeline, bubble_fraction, chrome_trace


def test_busy_counts_compute_spans_only():
    t = Timeline()
    for span in [Span("vision.forward[m=0]", "forward", 10.0, 10.5, 0),
                 Span("boundary.rows[m=0]", "boundary", 10.5, 11.5, 0),  # waiting for the other stage
                 Span("vision.backward[m=0]", "backward", 11.5, 12.0, 0),
                 Span("optimizer", "optimizer", 12.0, 12.1, 0),
                 Span("vision.forward[m=0]", "forward", 20.0, 21.0, 1)]:
        t.add(span)
    assert abs(t.step_busy(0) - 1.1) < 1e-9
    assert abs(bubble_fraction(t.step_busy(0), 2.2) - 0.5) < 1e-9
    assert bubble_fraction(3.0, 2.0) == 0.0 and bubble_fraction(1.0, 0.0) == 0.0


def test_span_context_records_even_when_the_body_raises():
    t = Timeline()
    try:
        with t.span("language.forward[m=1]", "forward", step=4):
            raise RuntimeError("peer died")
    except RuntimeError:
        pass
    assert [(s.name, s.step) for s in t.spans] == [("language.forward[m=1]", 4)]


def test_chrome_trace_has_one_track_per_rank_in_microseconds():
    ranks = [[Span("a", "forward", 100.0, 100.25, 0)], [Span("b", "boundary", 100.5, 101.0, 0)]]
    trace = json.loads(json.dumps(chrome_trace(ranks)))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["tid"], e["ts"], e["dur"], e["cat"]) for e in events] == [(0, 0.0, 250000.0, "forward"),
                                                                         (1, 500000.0, 500000.0, "boundary")]
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"]
    assert names == ["rank 0", "rank 1"]
    # a step's TFLOP/s and MFU as a counter track per rank (Timeline.count, docs/throughput.md)
    counters = [[Counter("throughput", 100.75, 0, {"tflops_per_device/model": 1.5, "mfu/model": 0.4})], []]
    trace = json.loads(json.dumps(chrome_trace(ranks, counters)))
    assert [(e["name"], e["tid"], e["ts"], e["args"]) for e in trace["traceEvents"] if e["ph"] == "C"] == [
        ("throughput (rank 0)", 0, 750000.0, {"tflops_per_device/model": 1.5, "mfu/model": 0.4})]
    t = Timeline()
    t.count("throughput", 3, {})  # a step without figures adds nothing
    t.count("throughput", 4, {"mfu/model": 0.1})
    assert [(c.step, c.values) for c in t.counters] == [(4, {"mfu/model": 0.1})]


def test_a_long_run_keeps_per_step_figures_and_bounded_memory():
    """Past the trace window (the old code stopped recording there: stage_time {}, bubble 1.0),
    every step's figures still come from that step's own spans, and memory stays bounded."""
    t = Timeline(trace_window=50)
    for step in range(5000):
        t0 = float(step)
        t.add(Span("vision.forward[m=0]", "forward", t0, t0 + 0.25, step))
        t.add(Span("boundary.rows[m=0]", "boundary", t0 + 0.25, t0 + 0.5, step))
        t.add(Span("language.backward[m=0]", "backward", t0 + 0.5, t0 + 0.625, step))
        assert abs(t.step_busy(step) - 0.375) < 1e-9
        assert t.step_stage_time(step) == {"vision": {"forward": 0.25}, "boundary": {"rows": 0.25},
                                           "language": {"backward": 0.125}}
    assert len(t.spans) == 50 and t.spans[-1].step == 4999  # the trace keeps the last window
    assert len(t._by_step) <= 2  # per-step bookkeeping: the open steps only
    t.trace_window = 10
    assert len(t.spans) == 10 and t.spans[-1].step == 4999
