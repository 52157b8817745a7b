"""The step prefetcher (data/prefetch.py): this rank's rows of the next steps, read by worker processes.

Pure: one process and its DataLoader workers. What each test shows:
- with 0, 1 or 2 workers the steps' samples are the same, position for position, and only this rank's
  positions are read (a counting dataset; negative control: reading every position reads more);
- asking for another step than the next (a resume, a retry) reads from that step on;
- a row that raises in a worker comes back as the step's problem, named; a worker killed mid-read, or a
  read slower than the timeout, is reported as the step's problem, never a hang, and the next call reads
  again with fresh workers.
"""

import os
import signal
import time

import pytest
import torch
from torch.utils.data import Dataset

from ds_hetero.config import parse_config
from ds_hetero.data.loader import GlobalBatchLoader
from ds_hetero.data.prefetch import StepPrefetcher
from ds_hetero.errors import HeteroConfigError


class Rows(Dataset):
    """Sample i: ids [i, i+1, ...]; `bad` rows raise; `kill` (a marker file) kills the worker reading it once;
    `slow` rows sleep."""

    def __init__(self, n=64, bad=(), kill=None, slow=(), reads=None):
        self.n, self.bad, self.kill, self.slow, self.reads = n, set(bad), kill, set(slow), reads

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.reads is not None:
            self.reads.append(i)
        if i in self.bad:
            raise ValueError(f"rows.jsonl: row {i}: broken")
        if self.kill is not None and os.path.exists(self.kill[1]) and i == self.kill[0]:
            os.remove(self.kill[1])
            os.kill(os.getpid(), signal.SIGKILL)
        if i in self.slow:
            time.sleep(8)
        return {"input_ids": torch.arange(i, i + 1 + i % 5)}


MINE = {1, 4, 6}  # this rank's positions in every step of 8


def _prefetcher(dataset, workers, start=0, timeout_s=60, positions=MINE):
    loader = GlobalBatchLoader(dataset, 8, seed=3)
    return loader, StepPrefetcher(loader, lambda step: set(positions), start, workers, 2, timeout_s)


def _steps(ahead, steps):
    out = []
    for s in steps:
        full, problem, waited = ahead.next(s)
        assert problem is None and waited >= 0
        out.append({p: x["input_ids"].tolist() for p, x in full.items()})
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_read_what_the_main_process_reads(workers):
    _, main = _prefetcher(Rows(), 0)
    _, ahead = _prefetcher(Rows(), workers)
    try:
        assert _steps(ahead, range(10)) == _steps(main, range(10))  # 10 steps of 8 from 64: into epoch 2
    finally:
        ahead.close()


def test_only_this_ranks_positions_are_read():
    reads = []
    loader, ahead = _prefetcher(Rows(reads=reads), 0)
    got = _steps(ahead, range(3))
    want = [{p: loader.indices(s)[p] for p in MINE} for s in range(3)]
    assert [{p: ids[0] for p, ids in step.items()} for step in got] == want
    assert sorted(reads) == sorted(i for step in want for i in step.values())
    every = []  # negative control: the old path read the whole global batch
    _, old = _prefetcher(Rows(reads=every), 0, positions=range(8))
    _steps(old, range(3))
    assert len(every) == 24 > len(reads)


def test_another_step_than_the_next_reads_from_there():
    _, fresh = _prefetcher(Rows(), 2, start=5)
    _, ahead = _prefetcher(Rows(), 2)
    try:
        _steps(ahead, range(2))
        assert _steps(ahead, [5, 6]) == _steps(fresh, [5, 6])
    finally:
        ahead.close()
        fresh.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_row_is_the_steps_problem(workers):
    loader = GlobalBatchLoader(Rows(), 8, seed=3)
    bad = loader.indices(1)[4]
    _, ahead = _prefetcher(Rows(bad={bad}), workers)
    try:
        _steps(ahead, [0])
        full, problem, _ = ahead.next(1)
        assert full == {} and problem == f"rows.jsonl: row {bad}: broken"
        assert _steps(ahead, [2]) == _steps(_prefetcher(Rows(), 0, start=2)[1], [2])  # the reader goes on
    finally:
        ahead.close()


def test_a_killed_worker_is_reported_then_replaced(tmp_path):
    loader = GlobalBatchLoader(Rows(), 8, seed=3)
    marker = tmp_path / "kill-once"
    marker.write_text("")
    _, ahead = _prefetcher(Rows(kill=(loader.indices(1)[6], str(marker))), 2)
    try:
        problems = []
        for _ in range(3):  # the death is seen at step 0 or 1, depending on how far the workers had read
            _, problem, _ = ahead.next(1 if problems or _ else 0)
            if problem:
                problems.append(problem)
        assert len(problems) == 1 and "reading step" in problems[0] and "exited unexpectedly" in problems[0], problems
        assert _steps(ahead, [1, 2]) == _steps(_prefetcher(Rows(), 0, start=1)[1], [1, 2])
    finally:
        ahead.close()


def test_a_read_slower_than_the_timeout_is_reported():
    loader = GlobalBatchLoader(Rows(), 8, seed=3)
    _, ahead = _prefetcher(Rows(slow={loader.indices(0)[1]}), 1, timeout_s=1)
    try:
        start = time.perf_counter()
        full, problem, waited = ahead.next(0)
        assert full == {} and "timed out" in problem and waited < 8 and time.perf_counter() - start < 15  # the row sleeps 8 s
    finally:
        ahead.close()


def _config(**keys):
    return {"train_batch_size": 8, "hetero_parallel": {
        "stages": {"vision": {"dp": 2}, "language": {"tp": 2, "dp": 1}}, **keys}}


@pytest.mark.parametrize("key,value", [("data_workers", -1), ("data_workers", 1.5), ("data_workers", True),
                                       ("data_workers", "2"), ("prefetch_steps", 0), ("prefetch_steps", None)])
def test_bad_data_keys_are_named(key, value):
    with pytest.raises(HeteroConfigError, match=rf"hetero_parallel.{key}.*must be an integer"):
        parse_config(_config(**{key: value}), world_size=2)
    parse_config(_config(**{key: 2}), world_size=2)  # negative control: a good value passes
