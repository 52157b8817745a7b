"""BoundaryCommunicator on 2-6 gloo ranks (fp64): forward, gradients, adjoint, bytes, errors.

Every rank derives the logical boundary rows X (one [H] row per image token of the micro-batch)
from a shared seed, takes its source share, exchanges and back-propagates twice:
  1. with a different random output gradient on every destination rank, so the parent can see
     which single copy each source gradient came from (a sum of two copies matches none): a
     source rank that is itself a copy of the row takes its own, the others one common copy;
  2. with the gradient of each logical row Y[g] on every copy of it (consistent replicas), for
     the adjoint identity.
The parent holds every rank's tensors and checks them against a reference that gathers
everything (tests/helpers/boundary_reference.py computes who needs what from the definitions).

Adjoint identity with replicas: a logical row held by k replicas appears k times in a plain
sum over ranks, so each rank's inner product is weighted by 1/k (k = source tp x cp on the
source side, destination tp without sequence parallelism on the destination side):
    sum_d <A x, y>_d / k_dst  ==  sum_s <x, A^T y>_s / k_src.
A backward that summed the destination replicas (scaled by tp) or skipped the completion
(replicas holding partial gradients) breaks it.
"""

import random

import pytest

from ds_hetero import HeteroConfigError, StageLayout
from ds_hetero.boundary import BoundaryInputs
from tests.helpers.boundary_reference import backward_lower_bound, dst_rows, lower_bound, src_rows
from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

H = 5


def lay(name, tp, cp, dp, ranks, sp=False):
    return StageLayout(name, tp, cp, dp, tuple(ranks), sequence_parallel=sp)


def inputs(counts, src_dp, dst_dp, seq_len=None, seed=0):
    """Random ascending placeholder positions when a sequence length is given."""
    if seq_len is None:
        return BoundaryInputs(counts, src_dp, dst_dp)
    rng = random.Random(seed)
    return BoundaryInputs(counts, src_dp, dst_dp, [sorted(rng.sample(range(seq_len), c)) for c in counts], seq_len)


def row_index(inp):
    """(sample, token) -> global row index g."""
    out, g = {}, 0
    for i, c in enumerate(inp.token_counts):
        for j in range(c):
            out[i, j] = g
            g += 1
    return out, g


# ---------------------------------------------------------------------------- per rank
def _one_case(rank, src, dst, placement, inp, seed):
    import torch

    from ds_hetero.boundary import BoundaryCommunicator
    from ds_hetero.topology.groups import build_groups

    groups = build_groups({"vision": src, "language": dst}, rank)
    import torch.distributed as dist

    calls = [0]
    real = dist.all_to_all_single

    def counted(*args, **kwargs):  # how many all-to-alls this rank issues (0 when no row moves)
        calls[0] += 1
        return real(*args, **kwargs)

    dist.all_to_all_single = counted
    try:
        if rank not in groups.boundary_ranks:
            return None
        comm = BoundaryCommunicator(src, dst, groups, placement, hidden_size=H, dtype=torch.float64)
        g_of, total = row_index(inp)
        gen = torch.Generator().manual_seed(seed)
        X = torch.randn(total, H, generator=gen, dtype=torch.float64)
        Y = torch.randn(total, H, generator=gen, dtype=torch.float64)
        mine = [g_of[r] for r in src_rows(src, inp, rank)]
        need = [g_of[r] for r in dst_rows(dst, inp, rank)]

        x = X[mine].clone().requires_grad_(True)
        out = comm.exchange(x, inp)
        y = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed * 100 + rank), dtype=torch.float64)
        (out * y).sum().backward()
        fwd, bwd = comm.last_forward, comm.last_backward

        x2 = X[mine].clone().requires_grad_(True)
        out2 = comm.exchange(x2, inp)
        y2 = Y[need]
        (out2 * y2).sum().backward()

        # The same exchange outside autograd (for explicit schedules) gives the same tensors.
        assert torch.equal(comm.exchange_rows(X[mine], inp), out.detach())
        assert torch.equal(comm.exchange_grads(y, inp), x.grad)
        # numpy, not torch: torch tensors cross processes by shared-memory handles that die with the child
        arrays = dict(x=X[mine], out=out, y=y, grad=x.grad, y2=y2, out2=out2, grad2=x2.grad, X=X, Y=Y)
        return dict({k: v.detach().numpy() for k, v in arrays.items()}, mine=mine, need=need,
                    fwd_sent=fwd.bytes_sent, fwd_recv=fwd.bytes_received,
                    total=fwd.total_bytes_sent, bound=fwd.lower_bound_bytes, bwd_sent=bwd.bytes_sent,
                    bwd_total=bwd.total_bytes_sent, bwd_bound=bwd.lower_bound_bytes, calls=calls[0])
    finally:
        dist.all_to_all_single = real
        groups.destroy()


def _cases(rank, world_size, cases):
    return [_one_case(rank, *case, seed=n + 1) for n, case in enumerate(cases)]


# ---------------------------------------------------------------------------- parent checks
def check_case(results, src, dst, placement, inp):
    import torch

    results = [None if res is None else {k: torch.as_tensor(v) if hasattr(v, "dtype") else v for k, v in res.items()}
               for res in results]
    ranks = [r for r, res in enumerate(results) if res is not None]
    X, Y = results[ranks[0]]["X"], results[ranks[0]]["Y"]
    g_of, _ = row_index(inp)
    # Forward: every destination rank holds exactly X at the rows it needs, in its order.
    for r in ranks:
        assert torch.equal(results[r]["out"], X[results[r]["need"]]), f"rank {r}: wrong forward rows"
    # Gradient 1: from exactly one copy; a source rank that is a copy takes its own (no bytes),
    # every other replica the same copy (identical gradients once the copies agree, see 2).
    copies = {}  # g -> [(rank, output row)]
    for r in ranks:
        for o, g in enumerate(results[r]["need"]):
            copies.setdefault(g, []).append((r, o))
    chosen = {}
    for r in ranks:
        for k, g in enumerate(results[r]["mine"]):
            got = results[r]["grad"][k]
            matches = [(d, o) for d, o in copies[g] if torch.equal(got, results[d]["y"][o])]
            assert len(matches) == 1, f"rank {r}: gradient of row {g} is not one copy's gradient"
            if any(d == r for d, _ in copies[g]):
                assert matches[0][0] == r, f"rank {r} holds a copy of row {g} but takes another's gradient"
            else:
                assert chosen.setdefault(g, matches[0]) == matches[0], f"row {g}: replicas got different gradients"
    # Gradient 2: the logical adjoint A^T y = Y at the rows held, and the weighted identity.
    k_src = src.tp * src.cp
    k_dst = 1 if dst.sequence_parallel else dst.tp
    lhs = sum((results[r]["out2"] * results[r]["y2"]).sum().item() for r in ranks) / k_dst
    rhs = sum((results[r]["x"] * results[r]["grad2"]).sum().item() for r in ranks) / k_src
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)
    for r in ranks:
        assert torch.equal(results[r]["grad2"], Y[results[r]["mine"]]), f"rank {r}: wrong adjoint"
    # Bytes: the rows every rank actually sent equal the lower bound, counted independently.
    row_bytes = H * 8
    sent = sum(results[r]["fwd_sent"] for r in ranks)
    assert sent == results[ranks[0]]["total"] == results[ranks[0]]["bound"] == lower_bound(src, dst, inp) * row_bytes
    # Backward: gradient rows sent (exchange and completion) equal the backward lower bound.
    bwd = sum(results[r]["bwd_sent"] for r in ranks)
    assert bwd == results[ranks[0]]["bwd_total"] == results[ranks[0]]["bwd_bound"] \
        == backward_lower_bound(src, dst, inp) * row_bytes
    # An exchange that moves no row on any rank is skipped on every rank (from the plan alone).
    if sent == 0 and bwd == 0:
        assert all(results[r]["calls"] == 0 for r in ranks), "an all-to-all with nothing to send was issued"
    else:
        assert all(results[r]["calls"] > 0 for r in ranks), "a rank skipped an exchange the others ran"
    if placement == "disaggregated":
        assert all(results[r]["fwd_recv"] == 0 for r in src.ranks), "a source rank received rows"
        assert all(results[r]["fwd_sent"] == 0 for r in dst.ranks), "a destination rank sent rows"
    return sent // row_bytes, bwd // row_bytes


def run_cases(world_size, cases):
    results = run_distributed(_cases, world_size, timeout=120, pg_timeout_s=30, cases=cases)
    return [check_case([res[n] for res in results], *case) for n, case in enumerate(cases)]


# ---------------------------------------------------------------------------- cases
def test_two_ranks():
    cases = [
        # destination replicas (language tp2), one local copy each, samples without images
        (lay("vision", 1, 1, 2, [0, 1]), lay("language", 2, 1, 1, [0, 1]), "colocated",
         inputs([3, 0, 2, 4], [0, 0, 1, 1], [0, 0, 0, 0])),
        # source replicas (vision tp2) share sending; completion; dp 1 -> 2
        (lay("vision", 2, 1, 1, [0, 1]), lay("language", 1, 1, 2, [0, 1]), "colocated",
         inputs([2, 5, 0, 1], [0, 0, 0, 0], [0, 0, 1, 1])),
        # sequence-parallel destination: each rank receives only its chunk
        (lay("vision", 1, 1, 2, [0, 1]), lay("language", 2, 1, 1, [0, 1], sp=True), "colocated",
         inputs([3, 2, 4], [0, 0, 1], [0, 0, 0], seq_len=8)),
        # disaggregated: the source receives nothing, the destination sends nothing
        (lay("vision", 1, 1, 1, [0]), lay("language", 1, 1, 1, [1]), "disaggregated",
         inputs([2, 3], [0, 0], [0, 0])),
    ]
    moved = run_cases(2, cases)
    # Hand-counted rows sent: rank 0 lacks 6 rows, rank 1 lacks 3; both vision replicas hold all.
    # Backward: each vision rank is a copy of its rows (0); the vision tp2 ranks each hold copies
    # of their language dp rank's 7 and 1 rows and need the other's (8); the single vision rank
    # of the disaggregated case needs all 5.
    assert moved[0] == (9, 0) and moved[1] == (0, 8) and moved[3] == (5, 5)


def test_four_ranks():
    counts = [3, 0, 2, 4, 0, 0, 1, 5]  # vision dp rank 2 gets no image at all
    vis4 = lay("vision", 1, 1, 4, range(4))
    s4, d2, d1 = [i // 2 for i in range(8)], [i // 4 for i in range(8)], [0] * 8
    cases = [
        (vis4, lay("language", 2, 1, 2, range(4)), "colocated", inputs(counts, s4, d2)),
        (vis4, lay("language", 4, 1, 1, range(4)), "colocated", inputs(counts, s4, d1)),
        (vis4, lay("language", 2, 2, 1, range(4), sp=True), "colocated", inputs(counts, s4, d1, seq_len=12)),
        # cp without sequence parallelism: tp replicas inside each cp chunk; source replicas too
        (lay("vision", 2, 1, 2, range(4)), lay("language", 2, 2, 1, range(4)), "colocated",
         inputs(counts, d2, d1, seq_len=8, seed=3)),
        # different per-sample counts, any sample -> rank assignment
        (lay("vision", 2, 1, 2, range(4)), lay("language", 1, 1, 4, range(4)), "colocated",
         inputs(counts, [1, 0, 1, 0, 1, 1, 0, 0], [3, 3, 0, 1, 2, 0, 1, 2])),
        (lay("vision", 2, 1, 1, [0, 1]), lay("language", 1, 2, 1, [2, 3]), "disaggregated",
         inputs([4, 1, 3], [0, 0, 0], [0, 0, 0], seq_len=6)),
        (lay("vision", 1, 1, 2, [2, 3]), lay("language", 2, 1, 1, [0, 1], sp=True), "disaggregated",
         inputs([4, 1, 3, 2], [0, 0, 1, 1], [0, 0, 0, 0], seq_len=10)),
    ]
    moved = run_cases(4, cases)
    assert all(fwd > 0 for fwd, _ in moved)


def test_four_ranks_identical_layouts_move_nothing():
    # vision tp2dp2 -> language tp2dp2 colocated: every rank holds a copy of its rows and of their
    # gradient, so nothing crosses the network either way (before: every row through completion).
    same = inputs([3, 0, 2, 4, 1, 5, 0, 2], [i // 4 for i in range(8)], [i // 4 for i in range(8)])
    cases = [(lay("vision", 2, 1, 2, range(4)), lay("language", 2, 1, 2, range(4)), "colocated", same)]
    assert run_cases(4, cases) == [(0, 0)]


def test_six_ranks_vision_dp3_to_language_dp2():
    counts = [2, 4, 0, 3, 1, 5]
    cases = [
        (lay("vision", 2, 1, 3, range(6)), lay("language", 3, 1, 2, range(6)), "colocated",
         inputs(counts, [i // 2 for i in range(6)], [i // 3 for i in range(6)])),
        (lay("vision", 2, 1, 3, range(6)), lay("language", 1, 3, 2, range(6)), "colocated",
         inputs(counts, [i // 2 for i in range(6)], [i // 3 for i in range(6)], seq_len=9)),
        # disaggregated on ranks 0-4; rank 5 belongs to no stage and takes no part
        (lay("vision", 1, 1, 3, [0, 1, 2]), lay("language", 1, 1, 2, [3, 4]), "disaggregated",
         inputs(counts, [i // 2 for i in range(6)], [i // 3 for i in range(6)])),
    ]
    run_cases(6, cases)


# ---------------------------------------------------------------------------- errors
def _errors(rank, world_size):
    import torch

    from ds_hetero.boundary import BoundaryCommunicator
    from ds_hetero.topology.groups import build_groups

    src, dst = lay("vision", 1, 1, 4, range(4)), lay("language", 2, 2, 1, range(4), sp=True)
    groups = build_groups({"vision": src, "language": dst}, rank)
    comm = BoundaryCommunicator(src, dst, groups, "colocated", hidden_size=H, dtype=torch.float64)
    good = inputs([2, 1, 3, 2], [0, 1, 2, 3], [0, 0, 0, 0], seq_len=8)
    n = good.token_counts[rank]

    def rows(count=n, hidden=H, dtype=torch.float64):
        return torch.ones(count, hidden, dtype=dtype, requires_grad=True)

    attempts = {
        "counts_vs_placeholders": lambda: comm.exchange(rows(), BoundaryInputs(
            good.token_counts, good.src_dp, good.dst_dp, [good.positions[0][:1]] + list(good.positions[1:]), 8)),
        "sample_on_no_rank": lambda: comm.exchange(rows(), BoundaryInputs(
            good.token_counts, [0, 1, None, 3], good.dst_dp, good.positions, 8)),
        "hidden_on_rank_1": lambda: comm.exchange(rows(hidden=H + 1 if rank == 1 else H), good),
        "dtype_on_rank_2": lambda: comm.exchange(rows(dtype=torch.float32 if rank == 2 else torch.float64), good),
        "row_count_on_rank_0": lambda: comm.exchange(rows(count=n + 1 if rank == 0 else n), good),
        "inputs_differ_on_rank_3": lambda: comm.exchange(rows(), good if rank != 3 else BoundaryInputs(
            good.token_counts, good.src_dp, good.dst_dp, good.positions, (8, 8, 8, 16))),
    }
    raised = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            raised[name] = None
        except HeteroConfigError as err:
            raised[name] = err.field
        # The group is still usable: nobody is stuck in a half-started collective.
        out = comm.exchange(rows(), good)
        out.sum().backward()
    groups.destroy()
    return raised


def test_errors_raise_on_every_rank_before_the_collective():
    results = run_distributed(_errors, 4, timeout=90, pg_timeout_s=20)
    expected = {
        "counts_vs_placeholders": "boundary.positions[0]",
        "sample_on_no_rank": "boundary.src_dp[2]",
        "hidden_on_rank_1": "boundary.rows",
        "dtype_on_rank_2": "boundary.rows",
        "row_count_on_rank_0": "boundary.rows",
        "inputs_differ_on_rank_3": "boundary.inputs",
    }
    for rank, raised in enumerate(results):
        assert raised == expected, f"rank {rank}: {raised}"


def test_inputs_from_input_ids():
    import torch

    from ds_hetero.boundary import inputs_from_input_ids

    ids = torch.tensor([[1, 9, 9, 2], [1, 2, 3, 4], [9, 1, 1, 9]])
    inp = inputs_from_input_ids(ids, 9, [0, 0, 1], [0, 1, 1])
    assert inp.token_counts == (2, 0, 2) and inp.positions == ((1, 2), (), (0, 3)) and inp.seq_len == 4
