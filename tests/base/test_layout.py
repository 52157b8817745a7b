"""StageLayout rank math, without processes."""

import itertools

import pytest

from ds_hetero.layout import Coord, StageLayout


def test_tp_varies_fastest_then_cp_then_dp():
    layout = StageLayout("language", tp=2, cp=2, dp=2, ranks=tuple(range(8)))
    assert [layout.coord(r) for r in range(8)] == [
        Coord(0, 0, 0), Coord(1, 0, 0), Coord(0, 1, 0), Coord(1, 1, 0),
        Coord(0, 0, 1), Coord(1, 0, 1), Coord(0, 1, 1), Coord(1, 1, 1),
    ]
    assert layout.tp_groups() == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert layout.cp_groups() == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert layout.dp_groups() == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert layout.dp_cp_groups() == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert layout.model_parallel_groups() == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_explicit_ranks_offset_and_permutation():
    layout = StageLayout("language", tp=2, cp=1, dp=2, ranks=(7, 5, 3, 1))
    assert layout.coord(5) == Coord(1, 0, 0) and layout.coord(1) == Coord(1, 0, 1)
    assert layout.rank_at(tp=0, dp=1) == 3
    assert layout.tp_groups() == [(7, 5), (3, 1)] and layout.dp_groups() == [(7, 3), (5, 1)]
    assert not layout.contains(0)
    with pytest.raises(KeyError, match="rank 0 is not in stage"):
        layout.coord(0)
    with pytest.raises(IndexError):
        layout.rank_at(tp=2)


@pytest.mark.parametrize("tp,cp,dp", [s for s in itertools.product((1, 2, 3), repeat=3)])
def test_groups_partition_the_stage_and_agree_with_coords(tp, cp, dp):
    ranks = tuple(range(10, 10 + tp * cp * dp))
    layout = StageLayout("s", tp=tp, cp=cp, dp=dp, ranks=ranks)
    for rank in ranks:
        c = layout.coord(rank)
        assert layout.rank_at(*c) == rank
    for kind, varying in [("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("dp_cp", "cp dp"), ("model", "tp cp")]:
        groups = layout.groups_of(kind)
        # every rank in exactly one group
        assert sorted(itertools.chain(*groups)) == list(ranks)
        expected_size = 1
        for axis in varying.split():
            expected_size *= getattr(layout, axis)
        assert all(len(g) == expected_size for g in groups)
        for g in groups:
            coords = [layout.coord(r) for r in g]
            fixed = [a for a in ("tp", "cp", "dp") if a not in varying.split()]
            for axis in fixed:  # fixed axes are constant inside a group
                assert len({getattr(c, axis) for c in coords}) == 1
            assert layout.group_containing(kind, g[-1]) == g


def test_layout_guards():
    with pytest.raises(ValueError, match="tp\\*cp\\*dp = 4 but 3 ranks"):
        StageLayout("s", tp=2, cp=1, dp=2, ranks=(0, 1, 2))
    with pytest.raises(ValueError, match="duplicate"):
        StageLayout("s", tp=1, cp=1, dp=2, ranks=(0, 0))
    with pytest.raises(ValueError, match="positive"):
        StageLayout("s", tp=0, cp=1, dp=2, ranks=())
