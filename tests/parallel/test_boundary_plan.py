"""BoundaryPlan without processes: every layout pair up to 6 ranks, simulated with row labels.

The simulator runs each rank's plan on symbolic rows (labels (sample, token)), exactly as the
communicator runs it on tensors: one all-to-all (send_index + splits -> recv_dest), local
copies, then for gradients the backward all-to-all and the completion among source replicas.
What every destination must end up with, and both lower bounds, are computed independently, from
the definitions in the plan's docstring (tests/helpers/boundary_reference.py); the simulator and the
pass bar are tests/helpers/plan_simulator.py.
"""

import dataclasses
import itertools
import random

import pytest

from ds_hetero import HeteroConfigError, StageLayout
from ds_hetero.boundary import BoundaryInputs, build_plan, shard_bounds
from tests.helpers.plan_simulator import check


# ---------------------------------------------------------------------------- case generation
def factorizations(n, axes):
    return [f for f in itertools.product(range(1, n + 1), repeat=axes) if _prod(f) == n]


def _prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


def layouts(n, name, ranks, with_cp):
    out = []
    for tp, cp, dp in factorizations(n, 3):
        if cp > 1 and not with_cp:
            continue
        for sp in ([False, True] if with_cp and tp > 1 else [False]):
            out.append(StageLayout(name, tp, cp, dp, tuple(ranks), sequence_parallel=sp))
    return out


def random_inputs(rng, src, dst, contiguous):
    shards = dst.cp * (dst.tp if dst.sequence_parallel else 1)
    n = src.dp * dst.dp * rng.choice([1, 2]) if contiguous else rng.randint(1, 7)
    counts = [rng.choice([0, 0, 1, 2, 3, 5]) for _ in range(n)]
    if contiguous:  # the batching convention: the d-th contiguous share
        src_dp = [i * src.dp // n for i in range(n)]
        dst_dp = [i * dst.dp // n for i in range(n)]
    else:  # any assignment, including dp ranks with no sample at all
        src_dp = [rng.randrange(src.dp) for _ in range(n)]
        dst_dp = [rng.randrange(dst.dp) for _ in range(n)]
    packed = rng.random() < 0.3
    seq_len = [shards * rng.randint(2, 4) for _ in range(n)] if packed else shards * rng.randint(2, 4)
    lens = seq_len if packed else [seq_len] * n
    counts = [min(c, lens[i]) for i, c in enumerate(counts)]
    positions = [sorted(rng.sample(range(lens[i]), counts[i])) for i in range(n)]
    return BoundaryInputs(counts, src_dp, dst_dp, positions, seq_len)


def all_pairs():
    for n in range(1, 7):  # colocated: the same n ranks, in order and reversed
        for src in layouts(n, "vision", range(n), with_cp=False):
            for dst in layouts(n, "language", range(n), with_cp=True):
                yield src, dst
        if n == 4:
            for dst in layouts(n, "language", (3, 1, 2, 0), with_cp=True):
                yield StageLayout("vision", 2, 1, 2, (0, 1, 2, 3)), dst
    for a, b in [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (2, 3), (2, 4), (4, 2)]:  # disaggregated
        for src in layouts(a, "vision", range(a), with_cp=False):
            for dst in layouts(b, "language", range(a, a + b), with_cp=True):
                yield src, dst
                yield (dataclasses.replace(src, ranks=tuple(range(b, a + b))),
                       dataclasses.replace(dst, ranks=tuple(range(b))))


def test_every_layout_pair_up_to_six_ranks():
    rng = random.Random(0)
    cases = 0
    for src, dst in all_pairs():
        for contiguous in (True, False, False):
            check(build_plan(src, dst, random_inputs(rng, src, dst, contiguous)))
            cases += 1
    assert cases > 700


def split_sources(rng, inputs, src):
    """The same inputs with samples cut into (rows, dp) runs on random source replicas (by image)."""
    src_dp = []
    for c, d in zip(inputs.token_counts, inputs.src_dp):
        cuts = sorted(rng.sample(range(1, c), min(c - 1, rng.randint(0, 2)))) if c > 1 else []
        bounds = [0] + cuts + [c]
        runs = tuple((b - a, rng.randrange(src.dp)) for a, b in zip(bounds, bounds[1:]))
        src_dp.append(runs if c and rng.random() < 0.7 else d)
    return dataclasses.replace(inputs, src_dp=src_dp)


def test_samples_split_across_source_replicas_every_layout_pair():
    # Token-balanced encoders split a sample's images over source replicas (ds_hetero/step/balance.py):
    # the plan stays exact and at both lower bounds for any runs, on every layout pair.
    rng = random.Random(1)
    cases = split = 0
    for src, dst in all_pairs():
        inputs = split_sources(rng, random_inputs(rng, src, dst, contiguous=True), src)
        split += any(isinstance(d, tuple) and len(d) > 1 for d in inputs.src_dp)
        check(build_plan(src, dst, inputs))
        cases += 1
    assert cases > 200 and split > 100


def test_split_sample_runs_order_source_rows_by_global_index():
    # sample 0: rows 0-1 on replica 1, row 2 on replica 0; sample 1 (3 rows) whole on replica 0:
    # replica 0 holds g = 2, 3, 4, 5 in that order, replica 1 holds g = 0, 1.
    src, dst = StageLayout("vision", 1, 1, 2, (0, 1)), StageLayout("language", 1, 1, 1, (2,))
    plan = build_plan(src, dst, BoundaryInputs([3, 3], [((2, 1), (1, 0)), 0], [0, 0]))
    check(plan)
    assert [plan.for_rank(r).n_in for r in (0, 1)] == [4, 2]
    assert plan.for_rank(2).forward.recv_dest == (2, 3, 4, 5, 0, 1)  # from rank 0, then rank 1


def test_positions_optional_without_sequence_shards():
    src, dst = StageLayout("vision", 1, 1, 3, (0, 1, 2)), StageLayout("language", 3, 1, 2, (3, 4, 5, 6, 7, 8))
    plan = build_plan(src, dst, BoundaryInputs([2, 0, 3, 1, 4, 2], [0, 0, 1, 1, 2, 2], [0, 0, 0, 1, 1, 1]))
    check(plan)
    assert plan.placement == "disaggregated"


def test_colocated_identical_layouts_move_nothing():
    # vision tp2dp2 -> language tp2dp2 on the same 4 ranks: each vision tp replica of dp d is a
    # language tp replica of dp d, so it holds a copy of every row and its gradient: no bytes
    # either way, and no completion collective (before: 8 * 576 rows through the completion).
    lay = StageLayout("vision", 2, 1, 2, (0, 1, 2, 3))
    for inp in (BoundaryInputs([3, 1, 2, 2], [0, 0, 1, 1], [0, 0, 1, 1]),
                BoundaryInputs([576] * 8, [i // 4 for i in range(8)], [i // 4 for i in range(8)])):
        plan = build_plan(lay, dataclasses.replace(lay, name="language"), inp)
        check(plan)
        assert plan.rows_sent() == plan.lower_bound_rows() == 0
        assert plan.backward_rows_sent() == plan.backward_lower_bound_rows() == 0
        assert all(plan.for_rank(r).completion is None for r in range(4))


def test_backward_sends_only_to_replicas_without_a_copy():
    # vision tp4 -> language tp2dp2 on the same 4 ranks: of a row for language dp 0, ranks 0 and 1
    # hold copies (their own gradient), ranks 2 and 3 get it once each from one of them.
    src = StageLayout("vision", 4, 1, 1, (0, 1, 2, 3))
    dst = StageLayout("language", 2, 1, 2, (0, 1, 2, 3))
    plan = build_plan(src, dst, BoundaryInputs([3, 5], [0, 0], [0, 1]))
    check(plan)
    assert plan.backward_lower_bound_rows() == plan.backward_rows_sent() == 2 * 8
    assert sum(plan.for_rank(r).backward.rows_sent for r in range(4)) == 0  # local copies only
    # The owners of a row alternate between its two copies: both share the completion sending.
    assert [plan.for_rank(r).completion.rows_sent for r in range(4)] == [4, 2, 4, 6]


def test_source_replicas_share_the_sending():
    src = StageLayout("vision", 2, 1, 1, (0, 1))
    dst = StageLayout("language", 1, 1, 2, (2, 3))
    plan = build_plan(src, dst, BoundaryInputs([40, 40], [0, 0], [0, 1]))
    sent = [plan.for_rank(r).forward.rows_sent for r in (0, 1)]
    assert sent == [40, 40]
    # No replica holds a copy: the designated copy returns each gradient to one replica, which
    # completes the other. Backward bytes == the backward lower bound: every row to both.
    owned = [plan.for_rank(r).completion.rows_sent for r in (0, 1)]
    assert owned == [40, 40]
    assert plan.backward_rows_sent() == plan.backward_lower_bound_rows() == 160


def test_lower_bound_counts_each_needing_rank():
    # Language tp2 without sequence parallelism: both tp ranks need every row.
    src = StageLayout("vision", 1, 1, 1, (0,))
    dst = StageLayout("language", 2, 1, 1, (1, 2))
    plan = build_plan(src, dst, BoundaryInputs([3, 2], [0, 0], [0, 0]))
    assert plan.lower_bound_rows() == 10 and plan.rows_sent() == 10
    # With sequence parallelism each row goes to one rank only.
    sp = dataclasses.replace(dst, sequence_parallel=True)
    plan = build_plan(src, sp, BoundaryInputs([3, 2], [0, 0], [0, 0], [[0, 1, 5], [2, 7]], 8))
    assert [plan.for_rank(r).n_out for r in (1, 2)] == [3, 2]
    assert plan.lower_bound_rows() == 5


def test_shard_bounds_convention():
    dst = StageLayout("language", 2, 2, 1, (0, 1, 2, 3), sequence_parallel=True)
    assert [shard_bounds(dst, r, 16) for r in range(4)] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    dst = dataclasses.replace(dst, sequence_parallel=False)
    assert [shard_bounds(dst, r, 16) for r in range(4)] == [(0, 8), (0, 8), (8, 16), (8, 16)]


# ---------------------------------------------------------------------------- the checker can fail
def _corrupt(plan, rank, **changes):
    """A plan whose rank `rank` runs a modified forward/backward Direction."""
    rp = plan.for_rank(rank)
    changed = dataclasses.replace(rp, **{k: dataclasses.replace(getattr(rp, k), **v) for k, v in changes.items()})
    plan._cache[("rank", rank)] = changed
    return plan


def _case():
    src, dst = StageLayout("vision", 1, 1, 2, (0, 1)), StageLayout("language", 2, 1, 1, (0, 1))
    return build_plan(src, dst, BoundaryInputs([2, 3], [0, 1], [0, 0]))


def test_checker_catches_rows_landing_in_the_wrong_place():
    plan = _case()
    check(plan)
    rd = plan.for_rank(0).forward.recv_dest
    with pytest.raises(AssertionError, match="wrong rows"):
        check(_corrupt(_case(), 0, forward={"recv_dest": rd[::-1]}))


def test_checker_catches_a_gradient_returned_by_two_copies():
    # Rank 1 also returns the gradient of a non-designated copy it received from rank 0: the
    # source row then gets two contributions (a sum over replicas, scaled by tp).
    plan = _case()
    fwd1 = plan.for_rank(1).forward
    bwd0, bwd1 = plan.for_rank(0).backward, plan.for_rank(1).backward
    extra_o = fwd1.recv_dest[0]                           # an output row of rank 1 from rank 0
    src_row = plan.for_rank(0).forward.send_index[0]      # the row rank 0 sent for it
    plan = _corrupt(plan, 1, backward={"send_index": bwd1.send_index + (extra_o,),
                                       "send_splits": (bwd1.send_splits[0] + 1, bwd1.send_splits[1])})
    plan = _corrupt(plan, 0, backward={"recv_dest": bwd0.recv_dest + (src_row,),
                                       "recv_splits": (bwd0.recv_splits[0], bwd0.recv_splits[1] + 1)})
    with pytest.raises(AssertionError, match="written twice"):
        check(plan)


def test_checker_catches_a_replica_left_without_a_gradient():
    # Rank 0 skips its completion: replica 1 ends with a partial gradient.
    src, dst = StageLayout("vision", 2, 1, 1, (0, 1)), StageLayout("language", 1, 1, 2, (2, 3))
    plan = build_plan(src, dst, BoundaryInputs([2, 3], [0, 0], [0, 1]))
    check(plan)
    plan = _corrupt(plan, 0, completion={"send_index": (), "send_splits": (0, 0)})
    plan = _corrupt(plan, 1, completion={"recv_dest": (), "recv_splits": (0, 0)})
    with pytest.raises(AssertionError, match="no gradient"):
        check(plan)


# ---------------------------------------------------------------------------- errors
V = StageLayout("vision", 1, 1, 2, (0, 1))
L_CP = StageLayout("language", 1, 2, 1, (0, 1))


@pytest.mark.parametrize(
    "src, dst, inputs, placement, field",
    [
        (V, L_CP, BoundaryInputs([2, 1], [0, 1], [0, 0], [[0, 3], [1, 2]], 4), None, "boundary.positions[1]"),
        (V, L_CP, BoundaryInputs([2, 1], [0, None], [0, 0], [[0, 3], [1]], 4), None, "boundary.src_dp[1]"),
        (V, L_CP, BoundaryInputs([2, 1], [0, 1], [0, 1], [[0, 3], [1]], 4), None, "boundary.dst_dp[1]"),
        (V, L_CP, BoundaryInputs([2, 1], [((1, 0), (2, 1)), 1], [0, 0], [[0, 3], [1]], 4), None, "boundary.src_dp[0]"),
        (V, L_CP, BoundaryInputs([2, 1], [((1, 0), (1, 2)), 1], [0, 0], [[0, 3], [1]], 4), None, "boundary.src_dp[0]"),
        (V, L_CP, BoundaryInputs([2, 1], [((0, 0), (2, 1)), 1], [0, 0], [[0, 3], [1]], 4), None, "boundary.src_dp[0]"),
        (V, L_CP, BoundaryInputs([2, 1], [0, 1], [0], [[0, 3], [1]], 4), None, "boundary.dst_dp"),
        (V, L_CP, BoundaryInputs([2, 1], [0, 1], [0, 0]), None, "boundary.positions"),
        (V, L_CP, BoundaryInputs([2, 1], [0, 1], [0, 0], [[0, 3], [1]], 5), None, "boundary.seq_len"),
        (V, L_CP, BoundaryInputs([2, 1], [0, 1], [0, 0], [[3, 0], [1]], 4), None, "boundary.positions[0]"),
        (V, L_CP, BoundaryInputs([2, -1], [0, 1], [0, 0], [[0, 3], []], 4), None, "boundary.token_counts[1]"),
        (V, L_CP, BoundaryInputs([2, 1], [0, 1], [0, 0], [[0, 3], [1]], 4), "disaggregated", "placement"),
        (V, StageLayout("language", 1, 1, 2, (1, 2)), BoundaryInputs([1], [0], [0]), None, "placement"),
    ],
)
def test_invalid_inputs_raise_a_field_error(src, dst, inputs, placement, field):
    with pytest.raises(HeteroConfigError) as err:
        build_plan(src, dst, inputs, placement)
    assert err.value.field == field
