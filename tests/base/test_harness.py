"""The multi-process harness itself: results come back, failures and hangs are reported."""

import time

import pytest

from ds_hetero.testing.launch import RankFailure, run_distributed

pytestmark = pytest.mark.distributed


def _all_reduce_rank(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def _rank_two_raises(rank, world_size):
    import torch.distributed as dist

    if rank == 2:
        raise RuntimeError("boom on rank two")
    dist.barrier()  # the others block here until the harness kills them


def _rank_one_hangs(rank, world_size):
    if rank == 1:
        time.sleep(600)
    return rank


def _echo(rank, world_size, first, second, key=None):
    import os

    return (rank, first, second, key, os.environ.get("DS_HETERO_HARNESS_PROBE"))


def _rank_one_raises_others_return(rank, world_size):
    if rank == 1:
        raise RuntimeError("boom on rank one")
    return rank * 10


def test_results_come_back_by_rank():
    assert run_distributed(_all_reduce_rank, world_size=3, timeout=60) == [3.0, 3.0, 3.0]


def test_child_traceback_is_propagated_and_nothing_hangs():
    start = time.monotonic()
    with pytest.raises(AssertionError, match="boom on rank two"):
        run_distributed(_rank_two_raises, world_size=4, timeout=60)
    assert time.monotonic() - start < 40


def test_hanging_rank_is_killed_at_the_deadline():
    start = time.monotonic()
    # Rank 0 returns at once, or, if a loaded machine has not even started it within the deadline,
    # is reported beside rank 1 (the pattern takes both); rank 1 sleeps 600 s. The deadline counts
    # from after the ranks' start, so the call cannot return before it, and must return soon after
    # it, not after the sleep (25 s of margin for killing and joining, as with the old 20 s deadline).
    with pytest.raises(AssertionError, match=r"ranks \[(0, )?1\] did not finish within 5s"):
        run_distributed(_rank_one_hangs, world_size=2, timeout=5)
    assert 5 <= time.monotonic() - start < 30


def test_positional_args_keywords_and_env_reach_every_rank():
    got = run_distributed(_echo, world_size=2, timeout=60, args=("a", 2), env={"DS_HETERO_HARNESS_PROBE": "set"},
                          key="k")
    assert got == [(0, "a", 2, "k", "set"), (1, "a", 2, "k", "set")]


def test_check_false_returns_the_failure_in_the_rank_list():
    got = run_distributed(_rank_one_raises_others_return, world_size=3, timeout=60, check=False)
    assert got[0] == 0 and got[2] == 20, got
    assert isinstance(got[1], RankFailure) and got[1].rank == 1 and "boom on rank one" in got[1].message, got


def test_cases_share_one_launch_and_a_failing_case_is_named():
    """ds_hetero.testing.cases.run_cases: every case's result by name on every rank; a case that
    raises names itself and keeps its own error in the rank's traceback."""
    from ds_hetero.testing.cases import run_cases

    cases = {"sum": (_all_reduce_rank, {}), "echo": (_echo, {"first": "a", "second": 2}),
             "raises": (_rank_one_raises_others_return, {})}
    got = run_distributed(run_cases, world_size=3, timeout=60, check=False, cases=cases)
    assert got[0] == {"sum": 3.0, "echo": (0, "a", 2, None, None), "raises": 0}, got
    assert got[2]["raises"] == 20, got
    assert isinstance(got[1], RankFailure), got
    assert "case 'raises' (_rank_one_raises_others_return) failed on rank 1" in got[1].message, got[1].message
    assert "boom on rank one" in got[1].message, got[1].message
