"""One verdict on a global batch, the same on every rank of every stage, from one small all-reduce.

Each rank checks what it can see of the global batch (its size, the samples it holds in full),
digests the boundary's inputs (every sample's image-token count, which every rank reads) and
counts the label tokens of its language share. One SUM all-reduce over the boundary group
(every rank of every stage) carries all three:

    [problem of rank 0 .. rank n-1 | digest of rank 0 .. rank n-1 | label tokens]

so every rank learns which ranks refused the batch, whether all ranks see the same boundary
inputs, and the global label-token count (the loss's denominator) at once, before any other
collective of the step, and all decide alike from the same vector. The all-reduce is started
before the step's work and waited for before its first other collective (`PendingVerdict`), so
its latency hides behind an encoder's first forward where that forward is the rank's own work. A refused batch raises the
same ValueError everywhere and leaves the engine as it was; a batch without label tokens is
refused alike (the loss would divide by zero). Slots per rank rather than a MAX: a SUM carries
the count too, in one collective (16 bytes a rank). With the digest agreed here every step, the
boundary's own per-exchange consensus is needed only on the first step (hidden size and dtype
do not change), so no exchange after it waits for an extra all-reduce and a host read.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import hashlib

import torch
import torch.distributed as dist


def local_problem(samples: Sequence[dict[str, Any]], global_batch_size: int,
                  check_sample: Callable[[dict[str, Any], int], None]) -> str | None:
    """What this rank finds wrong with the global batch (None: nothing); no communication."""
    if len(samples) != global_batch_size:
        return f"got {len(samples)} samples, but train_batch_size (the global batch) is {global_batch_size}"
    for i, s in enumerate(samples):
        if not isinstance(s, dict):
            return f"sample {i} is a {type(s).__name__}, not a dict"
        if s.get("light"):  # from the loader: another rank holds it in full and checks it
            continue
        try:
            check_sample(s, i)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return str(exc)
    return None


def digest(values: Iterable[int]) -> int:
    """A 62-bit digest of a list of ints (fits an int64 slot)."""
    text = repr(list(values)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 2


class BatchRefused(ValueError):
    """The agreement refused the global batch: raised alike on every rank, the engine unchanged."""


class PendingVerdict:
    """The agreement's all-reduce in flight. `labels()` waits for it (once), then returns the
    global label-token count or raises BatchRefused, the same on every rank.

    The engine starts it before the step's work and the schedule asks for the verdict right
    before its first collective (schedule/stage_work.py `await_verdict`): on every rank the
    all-reduce then overlaps work that involves no other rank (an encoder's first forward),
    and a rank's own problem is raised there as everyone else's is.
    """

    def __init__(self, work, vec: torch.Tensor, problem: str | None, group):
        self._work, self._vec, self._problem, self._group = work, vec, problem, group
        self._labels: int | None = None

    @property
    def resolved(self) -> bool:
        return self._labels is not None

    def labels(self) -> int:
        if self._labels is None:
            try:
                self._work.wait()
            except RuntimeError as exc:  # a peer gone (gloo: "Connection closed by peer"): from the
                # C++ wait no torch.distributed frame shows, so name it a collective's failure
                raise exc if isinstance(exc, dist.DistError) else dist.DistError(str(exc)) from exc
            self._labels = _verdict(self._vec.tolist(), self._problem, self._group)  # the one host read
        return self._labels


def start(problem: str | None, label_tokens: int, group, device: torch.device, inputs_digest: int = 0
          ) -> PendingVerdict:
    """Every rank of `group` sends its verdict, input digest and label count; returns at once.

    The device is the one the group's backend needs (NCCL: the accelerator; gloo: CPU).
    """
    size, me = dist.get_world_size(group), dist.get_rank(group)
    vec = torch.zeros(2 * size + 1, dtype=torch.long, device=device)
    vec[me] = problem is not None
    vec[size + me] = inputs_digest
    vec[2 * size] = label_tokens
    return PendingVerdict(dist.all_reduce(vec, group=group, async_op=True), vec, problem, group)


def agree(problem: str | None, label_tokens: int, group, device: torch.device, inputs_digest: int = 0) -> int:
    """`start` and wait: the global label-token count, or BatchRefused on every rank when any rank
    found a problem, the ranks' digests differ, or the batch has no label tokens."""
    return start(problem, label_tokens, group, device, inputs_digest).labels()


def _verdict(values: list[int], problem: str | None, group) -> int:
    size = dist.get_world_size(group)
    flags, digests, total = values[:size], values[size:2 * size], values[2 * size]
    if problem is not None:
        raise BatchRefused(f"train_batch: {problem}")
    bad = [dist.get_global_rank(group, i) for i, flag in enumerate(flags) if flag]
    if bad:
        raise BatchRefused(f"train_batch: rank {bad[0]} found an invalid sample in the global batch (see its error); "
                           f"ranks refusing it: {bad}")
    if len(set(digests)) > 1:
        odd = [dist.get_global_rank(group, i) for i, d in enumerate(digests) if d != digests[0]]
        raise BatchRefused(
            "train_batch: ranks were given different global batches (the image-token counts of the "
            f"samples differ between rank {dist.get_global_rank(group, 0)} and ranks {odd}); pass the same "
            "list on every rank")
    if total == 0:
        raise BatchRefused("train_batch: the global batch has no label tokens (all labels are -100)")
    return int(total)
