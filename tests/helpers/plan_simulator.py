"""BoundaryPlan run on symbolic rows, without processes: the simulator and the pass bar.

The simulator runs each rank's plan on labels (sample, token), exactly as the communicator runs
it on tensors: one all-to-all (send_index + splits -> recv_dest), local copies, then for
gradients the backward all-to-all and the completion among source replicas. `check` compares
the outcome with what the definitions say every rank must hold (boundary_reference), and the
bytes with both lower bounds. Shared by the plan tests and the balancing tests.
"""

import itertools

from tests.helpers.boundary_reference import backward_lower_bound, dst_rows, lower_bound, src_rows


def _exchange(plans, direction, data, group, n_out):
    """Run one Direction on every rank of `group` (sorted ranks) with label lists."""
    out = {r: [None] * n_out[r] for r in group}
    chunks = {}
    for r in group:
        d = direction(plans[r])
        buf = [data[r][k] for k in d.send_index]
        start = 0
        for p, n in zip(group, d.send_splits):
            chunks[r, p] = buf[start:start + n]
            start += n
        assert start == len(buf)
    for r in group:
        d = direction(plans[r])
        buf = []
        for p, n in zip(group, d.recv_splits):
            assert len(chunks[p, r]) == n, f"rank {r} expects {n} rows from {p}, gets {len(chunks[p, r])}"
            buf += chunks[p, r]
        assert len(buf) == len(d.recv_dest)
        copies = ((data[r][s], o) for s, o in zip(d.local_src, d.local_dst))
        for value, o in itertools.chain(zip(buf, d.recv_dest), copies):
            assert out[r][o] is None, f"rank {r}: row {o} written twice"
            out[r][o] = value
    return out


def simulate(plan):
    """Forward and backward of every rank on labels; returns (inputs, outputs, gradients)."""
    src, inputs, peers = plan.src, plan.inputs, plan.peers
    plans = {r: plan.for_rank(r) for r in peers}
    x = {r: src_rows(src, inputs, r) for r in peers}
    for r in peers:
        assert plans[r].n_in == len(x[r])
    y = _exchange(plans, lambda p: p.forward, x, peers, {r: plans[r].n_out for r in peers})
    # Gradient labels name the copy they come from: (destination rank, output row).
    dy = {r: [(r, o) for o in range(plans[r].n_out)] for r in peers}
    dx = _exchange(plans, lambda p: p.backward, dy, peers, {r: plans[r].n_in for r in peers})
    for group in {plans[r].replicas for r in peers if plans[r].completion is not None}:
        done = _exchange(plans, lambda p: p.completion, dx, group, {r: plans[r].n_in for r in group})
        for r in group:
            for k, v in enumerate(done[r]):
                if v is not None:
                    assert dx[r][k] is None, f"rank {r}: completion overwrites owned row {k}"
                    dx[r][k] = v
    return x, y, dx


def check(plan):
    """Simulate `plan` and assert every row lands where it belongs, each gradient comes from one copy,
    and the rows sent equal both lower bounds (forward and backward)."""
    src, dst, inputs, peers = plan.src, plan.dst, plan.inputs, plan.peers
    x, y, dx = simulate(plan)
    for r in peers:
        assert y[r] == dst_rows(dst, inputs, r), f"rank {r} receives the wrong rows"
    # Every source replica ends with a gradient for every row, taken from exactly one copy of
    # that row (a copy: some destination rank's output row holding the same label; the simulator
    # rejects a row written twice, i.e. a sum). A replica that is itself a copy takes its own
    # (no bytes); the others all take the same copy. Copies' gradients are identical by the tp
    # convention, so all replicas end with the full, identical gradient.
    remote = {}
    for r in peers:
        for label, g in zip(x[r], dx[r]):
            assert g is not None, f"rank {r}: no gradient for row {label}"
            d, o = g
            assert y[d][o] == label, f"rank {r}: gradient of {label} comes from a copy of {y[d][o]}"
            if label in y[r]:
                assert d == r, f"rank {r} holds a copy of {label} but takes the gradient of rank {d}'s"
            else:
                remote.setdefault(label, set()).add(g)
    assert all(len(v) == 1 for v in remote.values()), "replicas without a copy got different copies"
    assert plan.rows_sent() == plan.lower_bound_rows() == lower_bound(src, dst, inputs)
    assert plan.backward_rows_sent() == plan.backward_lower_bound_rows() == backward_lower_bound(src, dst, inputs)
    if plan.placement == "disaggregated":
        for r in src.ranks:
            assert plans_rank(plan, r).forward.rows_received == 0 and plans_rank(plan, r).n_out == 0
        for r in dst.ranks:
            assert plans_rank(plan, r).forward.rows_sent == 0 and plans_rank(plan, r).n_in == 0
            assert plans_rank(plan, r).backward.rows_received == 0


def plans_rank(plan, r):
    return plan.for_rank(r)
