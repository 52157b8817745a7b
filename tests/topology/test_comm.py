"""Differentiable collectives: adjoint identity, forward equality, size-1 short circuit.

One 4-rank launch computes every check on groups of 1, 2 ([0,1], [2,3]) and 4 ranks; the tests
below read its results. The adjoint identity sum_r <A x, y> = sum_r <x, A^T y> is taken with the
inner product each placement implies: a tensor that is replicated with a replicated gradient
counts once (weight 1/n over the n identical copies), every other pairing (S with S, R value
with P gradient, P value with R gradient) sums over ranks.
"""

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

# op -> (input kind, output-gradient kind, input weight is 1/n, output weight is 1/n)
#   kind "R": the same tensor on every rank of the group; "X": a different tensor per rank.
OPS = {
    "copy_to_region": ("R", "X", True, False),
    "reduce_from_region": ("X", "R", False, True),
    "all_gather": ("X", "X", False, False),
    "gather_from_region": ("X", "R", False, True),
    "split_to_region": ("R", "X", True, False),
    "reduce_scatter": ("X", "X", False, False),
    "all_to_all": ("X", "X", False, False),
}
SIZES = (2, 4)


def _rand(shape, *key):
    import zlib

    import torch

    # crc32, not hash(): str hashes are salted per interpreter, and every rank must agree.
    gen = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _a2a_send(n, i):
    """Uneven rows rank i sends to each peer, zeros included."""
    return [(i + 2 * p) % 3 for p in range(n)]


def _case(op, n, i, tag):
    """(x, y, forward(x), expected output) for member i of an n-rank group; tag separates groups."""
    import torch

    from ds_hetero import comm

    kind_x, kind_y = OPS[op][:2]
    in_shape, out_shape = {
        "copy_to_region": ((3, 4), (3, 4)),
        "reduce_from_region": ((3, 4), (3, 4)),
        "all_gather": ((3, 2, 5), (3, 2 * n, 5)),
        "gather_from_region": ((3, 2, 5), (3, 2 * n, 5)),
        "split_to_region": ((3, 2 * n, 5), (3, 2, 5)),
        "reduce_scatter": ((3, 2 * n, 5), (3, 2, 5)),
        "all_to_all": ((sum(_a2a_send(n, i)), 4), (sum(_a2a_send(n, p)[i] for p in range(n)), 4)),
    }[op]

    def x_of(j):
        shape = (sum(_a2a_send(n, j)), 4) if op == "all_to_all" else in_shape
        return _rand(shape, op, tag, "x", j if kind_x == "X" else -1)

    xs = [x_of(j) for j in range(n)]
    y = _rand(out_shape, op, tag, "y", i if kind_y == "X" else -1)
    expected = {
        "copy_to_region": lambda: xs[i],
        "reduce_from_region": lambda: sum(xs),
        "all_gather": lambda: torch.cat(xs, dim=1),
        "gather_from_region": lambda: torch.cat(xs, dim=1),
        "split_to_region": lambda: xs[i].chunk(n, dim=1)[i],
        "reduce_scatter": lambda: sum(xs).chunk(n, dim=1)[i],
        "all_to_all": lambda: torch.cat([xs[p].split(_a2a_send(n, p))[i] for p in range(n)]),
    }[op]()
    fwd = {
        "copy_to_region": lambda x, g: comm.copy_to_region(x, g),
        "reduce_from_region": lambda x, g: comm.reduce_from_region(x, g),
        "all_gather": lambda x, g: comm.all_gather(x, 1, g),
        "gather_from_region": lambda x, g: comm.gather_from_region(x, -2, g),  # negative dim on purpose
        "split_to_region": lambda x, g: comm.split_to_region(x, 1, g),
        "reduce_scatter": lambda x, g: comm.reduce_scatter(x, 1, g),
        "all_to_all": lambda x, g: comm.all_to_all(
            x, _a2a_send(n, i), [_a2a_send(n, p)[i] for p in range(n)], g
        ),
    }[op]
    return xs[i], y, fwd, expected


def _comm_checks(rank, world_size):
    import torch
    import torch.distributed as dist

    groups = {}
    for members in ([0], [1], [2], [3], [0, 1], [2, 3], [0, 1, 2, 3]):
        g = dist.new_group(members)  # every rank creates every group, in one order
        if rank in members:
            groups[len(members)] = (g, members)

    results = {}
    for n in SIZES:
        group, members = groups[n]
        i, tag = members.index(rank), members[0]
        for op, (_, _, w_in, w_out) in OPS.items():
            x0, y0, fwd, expected = _case(op, n, i, tag)
            x, y = x0.clone().requires_grad_(True), y0.clone()
            out = fwd(x, group)
            out.backward(y)
            sides = torch.stack([
                (out.detach() * y0).sum() / (n if w_out else 1),
                (x0 * x.grad).sum() / (n if w_in else 1),
            ])
            dist.all_reduce(sides, group=group)
            results[f"{op}/n{n}"] = dict(
                lhs=sides[0].item(), rhs=sides[1].item(),
                fwd_err=(out.detach() - expected).abs().max().item() if expected.numel() else 0.0,
                shape_ok=tuple(out.shape) == tuple(expected.shape),
                untouched=torch.equal(x.detach(), x0) and torch.equal(y, y0),
            )

    # A group of one rank: no communication, no autograd node, the tensor itself comes back.
    single, _ = groups[1]
    from ds_hetero import comm

    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    outs = [comm.copy_to_region(x, single), comm.reduce_from_region(x, single), comm.all_gather(x, 1, single),
            comm.gather_from_region(x, 1, single), comm.split_to_region(x, 1, single),
            comm.reduce_scatter(x, 1, single), comm.all_to_all(x, [2], [2], single)]
    results["size1_identity"] = all(o is x for o in outs)

    # Bad shapes fail before any communication, identically on every rank (nobody is left waiting).
    group4, _ = groups[4]
    errors = []
    for call in (lambda: comm.reduce_scatter(torch.randn(3, 6), 1, group4),
                 lambda: comm.split_to_region(torch.randn(3, 6), 1, group4),
                 lambda: comm.all_to_all(torch.randn(3, 2), [1, 1, 1, 1], [1, 1, 1, 1], group4),
                 lambda: comm.copy_to_region(torch.randn(2), None)):
        try:
            call()
            errors.append(None)
        except (ValueError, TypeError) as exc:
            errors.append(type(exc).__name__)
    dist.barrier()
    results["errors"] = errors
    return results


@pytest.fixture(scope="module")
def comm_results():
    return run_distributed(_comm_checks, world_size=4, timeout=120)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", list(OPS))
def test_adjoint_identity(comm_results, op, n):
    for rank, res in enumerate(comm_results):
        r = res[f"{op}/n{n}"]
        assert abs(r["lhs"]) > 1e-3, "degenerate test data"
        assert r["lhs"] == pytest.approx(r["rhs"], rel=1e-12, abs=0), (rank, r)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", list(OPS))
def test_forward_equals_single_process(comm_results, op, n):
    for rank, res in enumerate(comm_results):
        r = res[f"{op}/n{n}"]
        assert r["shape_ok"], (rank, r)
        assert r["fwd_err"] <= 1e-12, (rank, r)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", list(OPS))
def test_inputs_and_gradients_are_not_modified(comm_results, op, n):
    assert all(res[f"{op}/n{n}"]["untouched"] for res in comm_results)


def test_group_of_one_is_identity(comm_results):
    assert all(res["size1_identity"] for res in comm_results)


def test_bad_shapes_and_missing_group_raise_before_communicating(comm_results):
    for res in comm_results:
        assert res["errors"] == ["ValueError", "ValueError", "ValueError", "TypeError"]
