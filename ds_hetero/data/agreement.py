"""One verdict on a global batch, the same on every rank of every stage, from one small all-reduce.

Each rank checks what it can see of the global batch (its size, the samples it holds in full),
digests the boundary's inputs (every sample's image-token count, which every rank reads) and
counts the label tokens of its language share. One SUM all-reduce over the boundary group
(every rank of every stage) carries all three:

    [problem of rank 0 .. rank n-1 | digest of rank 0 .. rank n-1 | label tokens]

so every rank learns which ranks refused the batch, whether all ranks see the same boundary
inputs, and the global label-token count (the loss's denominator) at once, before any other
collective of the step, and all decide alike from the same vector. A refused batch raises the
same ValueError everywhere (the refusing ranks' texts gathered then, on that path only: every rank
names the bad row, not just the rank that read it) and leaves the engine as it was; a batch without label tokens is
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


def agree(problem: str | None, label_tokens: int, group, device: torch.device, inputs_digest: int = 0) -> int:
    """All ranks of `group` exchange their verdicts, input digests and label counts; returns the
    global label-token count.

    Raises ValueError on every rank when any rank found a problem, the ranks' digests differ, or
    the batch has no label tokens. The device is the one the group's backend needs (NCCL: the
    accelerator; gloo: CPU).
    """
    size, me = dist.get_world_size(group), dist.get_rank(group)
    vec = torch.zeros(2 * size + 1, dtype=torch.long, device=device)
    vec[me] = problem is not None
    vec[size + me] = inputs_digest
    vec[2 * size] = label_tokens
    dist.all_reduce(vec, group=group)
    values = vec.tolist()  # the step's one host read of it
    flags, digests, total = values[:size], values[size:2 * size], values[2 * size]
    bad = [dist.get_global_rank(group, i) for i, flag in enumerate(flags) if flag]
    if bad:  # every rank saw the flags: all take this path, so one more collective here is safe
        texts: list[Any] = [None] * size
        dist.all_gather_object(texts, problem, group=group)  # only on a refused batch: the text itself
        first = next(t for t in texts if t is not None)
        raise ValueError(f"train_batch: {first} (rank {bad[0]} found an invalid sample in the global batch; "
                         f"ranks refusing it: {bad})")
    if len(set(digests)) > 1:
        odd = [dist.get_global_rank(group, i) for i, d in enumerate(digests) if d != digests[0]]
        raise ValueError(
            "train_batch: ranks were given different global batches (the image-token counts of the "
            f"samples differ between rank {dist.get_global_rank(group, 0)} and ranks {odd}); pass the same "
            "list on every rank")
    if total == 0:
        raise ValueError("train_batch: the global batch has no label tokens (all labels are -100)")
    return int(total)
