"""The colocated encoders' order inside a pipelined language stage (schedule/fill_drain.py), pure.

For pp 2..4, micro-batches 2..8, encoder passes equal to or fewer than the micro-batches, and two
encoders with different pass counts: every pass has exactly one forward, rows exchange, gradient
exchange and backward, in that order on every rank; its rows arrive before pipeline stage 0's
forward of the first micro-batch it feeds and its gradients leave after stage 0's backward of the
last; work after a step's commands sits only in that stage's idle steps; every rank enters the
same exchanges in the same order; encoder work does fill the fill and drain; and a lock-step
simulation of every rank's program (DeepSpeed's 1F1B commands with isend / blocking recv, plus
the exchanges as collectives) completes. Negative control: the exchange placed right before each
rank's OWN forward of the micro-batch (what an encoder inline in every pipeline stage would do)
deadlocks in the same simulation, so the simulation can fail. The phased order (fill=False, the
benchmark's baseline) is simulated too. A frozen encoder (`frozen`) gets only a forward and a rows
exchange per pass, a trained one beside it all four, and the simulation still completes.
"""

from collections import deque

import pytest
from deepspeed.runtime.pipe import schedule as ds

from ds_hetero.schedule.fill_drain import compute_steps, fill_drain_order, train_steps

CASES = [  # (pp, micro_batches, {encoder: passes})
    (2, 2, {"vision": 2}), (2, 4, {"vision": 4}), (2, 4, {"vision": 2}), (2, 4, {"vision": 1}),
    (2, 8, {"vision": 8}), (3, 4, {"vision": 4}), (4, 4, {"vision": 4}), (4, 8, {"vision": 2}),
    (2, 4, {"vision": 4, "audio": 2}), (3, 6, {"vision": 3, "audio": 6}),
]


def _feeds(micro_batches, passes):
    per = micro_batches // passes
    return [range(k * per, (k + 1) * per) for k in range(passes)]


def _orders(pp, micro_batches, encoders, fill=True):
    feeds = {n: _feeds(micro_batches, k) for n, k in encoders.items()}
    return feeds, [fill_drain_order(feeds, micro_batches, pp, s, fill) for s in range(pp)]


def _program(order, steps):
    """This stage's ops in execution order: ("work", kind, name, k) and 1F1B commands."""
    ops = []
    for t in range(order.steps + 1):
        ops += [("work", *w) for w in order.before.get(t, ())]
        if t < order.steps:
            ops += [("cmd", c) for c in steps[t]]
            ops += [("work", *w) for w in order.after.get(t, ())]
    return ops


@pytest.mark.parametrize("pp,micro_batches,encoders", CASES)
def test_every_pass_runs_once_in_order(pp, micro_batches, encoders):
    feeds, orders = _orders(pp, micro_batches, encoders)
    first, last, _ = compute_steps(train_steps(micro_batches, pp, 0))
    for s, order in enumerate(orders):
        steps = train_steps(micro_batches, pp, s)
        _, _, busy = compute_steps(steps)
        ops = _program(order, steps)
        work = [op[1:] for op in ops if op[0] == "work"]
        for name, fs in feeds.items():
            for k, f in enumerate(fs):
                at = {kind: [i for i, w in enumerate(work) if w == (kind, name, k)]
                      for kind in ("forward", "rows", "grads", "backward")}
                assert all(len(v) == 1 for v in at.values()), (s, name, k, at)
                assert at["forward"][0] < at["rows"][0] < at["grads"][0] < at["backward"][0], (s, name, k, at)
                # rows before stage 0's forward of f.start, gradients after its backward of f.stop - 1
                step_of = {w: t for t, ws in order.before.items() for w in ws}
                assert step_of["rows", name, k] <= first[f.start], (s, name, k, order.before)
                assert step_of["grads", name, k] >= last[f.stop - 1] + 1, (s, name, k, order.before)
            # the gradient-accumulation boundary: the last pass's backward is this encoder's last
            backwards = [w[2] for w in work if w[:2] == ("backward", name)]
            assert backwards[-1] == len(fs) - 1, (s, name, backwards)
        for t, items in order.after.items():
            assert not busy[t] and len(items) == 1, (s, t, items, busy)
        assert order.exchanges() == orders[0].exchanges(), s  # every rank: the same collectives


@pytest.mark.parametrize("pp,micro_batches,encoders", CASES)
def test_encoder_work_fills_idle_steps(pp, micro_batches, encoders):
    """Every stage puts encoder work into idle steps when it has passes left to place: the later
    stages' fill and the earlier stages' drain (what the phased order left empty)."""
    _, orders = _orders(pp, micro_batches, encoders)
    movable = sum(encoders.values()) - len(encoders)  # all but the first forward / last backward
    for s, order in enumerate(orders):
        kinds = [w[0] for items in order.after.values() for w in items]
        if movable:
            assert "forward" in kinds and "backward" in kinds, (s, order.after)


@pytest.mark.parametrize("pp,micro_batches,encoders", CASES)
def test_exchanges_inside_only_for_moved_passes(pp, micro_batches, encoders):
    """An exchange inside the 1F1B is a barrier: only a pass whose forward (rows) or backward
    (gradients) some stage runs in an idle step gets one; every other pass's exchanges sit
    before step 0 or after the last step."""
    _, orders = _orders(pp, micro_batches, encoders)
    moved = {(w[0], w[1], w[2]) for o in orders for items in o.after.values() for w in items}
    for t, kind, name, k in orders[0].exchanges():
        if 0 < t < orders[0].steps:
            assert ({"rows": "forward", "grads": "backward"}[kind], name, k) in moved, (t, kind, name, k)


def _simulate(programs, pp):
    """Run every stage's program lock-free: isend never blocks, recv blocks until the matching
    message (FIFO per neighbour and kind) was sent, an exchange blocks until every rank is at the
    same exchange. Returns True when every program completes, False on a deadlock."""
    queues = {}
    pos = [0] * pp
    while True:
        progressed = False
        for s in range(pp):
            while pos[s] < len(programs[s]):
                op = programs[s][pos[s]]
                if op[0] == "cmd":
                    c = op[1]
                    if isinstance(c, ds.SendActivation):
                        queues.setdefault(("act", s + 1), deque()).append(1)
                    elif isinstance(c, ds.SendGrad):
                        queues.setdefault(("grad", s - 1), deque()).append(1)
                    elif isinstance(c, (ds.RecvActivation, ds.RecvGrad)):
                        q = queues.setdefault(("act" if isinstance(c, ds.RecvActivation) else "grad", s), deque())
                        if not q:
                            break
                        q.popleft()
                elif op[0] == "coll":
                    break  # resolved below, when every rank is there
                pos[s] += 1
                progressed = True
        heads = [programs[s][pos[s]] if pos[s] < len(programs[s]) else None for s in range(pp)]
        if all(h is None for h in heads):
            return True
        if all(h is not None and h[0] == "coll" for h in heads):
            assert len({h for h in heads}) == 1, heads  # the same collective everywhere
            pos = [p + 1 for p in pos]
            progressed = True
        if not progressed:
            return False


def _with_collectives(ops):
    return [("coll", *op[1:]) if op[0] == "work" and op[1] in ("rows", "grads") else op for op in ops
            if not (op[0] == "work" and op[1] in ("forward", "backward"))]


@pytest.mark.parametrize("fill", [True, False], ids=["fill_drain", "phased"])
@pytest.mark.parametrize("pp,micro_batches,encoders", CASES)
def test_lock_step_simulation_completes(pp, micro_batches, encoders, fill):
    _, orders = _orders(pp, micro_batches, encoders, fill)
    programs = [_with_collectives(_program(o, train_steps(micro_batches, pp, s))) for s, o in enumerate(orders)]
    assert _simulate(programs, pp)
    if not fill:  # the phased baseline: nothing inside the 1F1B
        assert not any(o.after for o in orders) and all(set(o.before) == {0, o.steps} for o in orders)


def test_negative_control_exchange_at_each_stages_own_forward_deadlocks():
    """The same exchanges, each entered right before the rank's OWN forward of the micro-batch
    (stage s reaches it s steps later than stage 0): the simulation detects the deadlock."""
    pp, micro_batches = 2, 4
    programs = []
    for s in range(pp):
        ops, m = [], 0
        for cmds in train_steps(micro_batches, pp, s):
            for c in cmds:
                if isinstance(c, ds.ForwardPass):
                    ops.append(("coll", "rows", "vision", m))
                    m += 1
                ops.append(("cmd", c))
        programs.append(ops)
    assert not _simulate(programs, pp)


FROZEN_CASES = [(2, 4, {"vision": 4}, {"vision"}), (2, 4, {"vision": 2}, {"vision"}),
                (4, 8, {"vision": 2}, {"vision"}), (3, 6, {"vision": 3, "audio": 6}, {"audio"}),
                (2, 4, {"vision": 4, "audio": 2}, {"vision", "audio"})]


@pytest.mark.parametrize("fill", [True, False], ids=["fill_drain", "phased"])
@pytest.mark.parametrize("pp,micro_batches,encoders,frozen", FROZEN_CASES)
def test_frozen_encoder_has_no_gradient_work(pp, micro_batches, encoders, frozen, fill):
    feeds = {n: _feeds(micro_batches, k) for n, k in encoders.items()}
    orders = [fill_drain_order(feeds, micro_batches, pp, s, fill, frozen) for s in range(pp)]
    for s, order in enumerate(orders):
        work = [op[1:] for op in _program(order, train_steps(micro_batches, pp, s)) if op[0] == "work"]
        for name, fs in feeds.items():
            for k in range(len(fs)):
                kinds = [w[0] for w in work if w[1:] == (name, k)]
                want = ["forward", "rows"] if name in frozen else ["forward", "rows", "grads", "backward"]
                assert kinds == want, (s, name, k, kinds)
        assert order.exchanges() == orders[0].exchanges(), s  # every rank: the same collectives
    programs = [_with_collectives(_program(o, train_steps(micro_batches, pp, s))) for s, o in enumerate(orders)]
    assert _simulate(programs, pp)
