"""One verdict on a global batch, the same on every rank of every stage, from one small all-reduce.

Each rank checks what it can see of the global batch (its size, the samples it holds in full)
and counts the label tokens of its language share. One SUM all-reduce over the boundary group
(every rank of every stage) carries both:

    [problem of boundary rank 0, ..., problem of boundary rank n-1, label tokens]

so every rank learns which ranks refused the batch and the global label-token count (the
loss's denominator) at once, before any other collective of the step. A refused batch raises
the same ValueError everywhere and leaves the engine as it was; a batch without label tokens
is refused alike (the loss would divide by zero). One slot per rank rather than a MAX of the
failing rank: a SUM carries the count too, in one collective (8 bytes a rank).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

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


def agree(problem: str | None, label_tokens: int, group, device: torch.device) -> int:
    """All ranks of `group` exchange their verdicts and label counts; returns the global count.

    Raises ValueError on every rank when any rank found a problem or the batch has no label
    tokens. The device is the one the group's backend needs (NCCL: the accelerator; gloo: CPU).
    """
    size, me = dist.get_world_size(group), dist.get_rank(group)
    vec = torch.zeros(size + 1, dtype=torch.long, device=device)
    vec[me] = problem is not None
    vec[size] = label_tokens
    dist.all_reduce(vec, group=group)
    *flags, total = vec.tolist()  # the step's one host read of it
    if problem is not None:
        raise ValueError(f"train_batch: {problem}")
    bad = [dist.get_global_rank(group, i) for i, flag in enumerate(flags) if flag]
    if bad:
        raise ValueError(f"train_batch: rank {bad[0]} found an invalid sample in the global batch (see its error); "
                         f"ranks refusing it: {bad}")
    if total == 0:
        raise ValueError("train_batch: the global batch has no label tokens (all labels are -100)")
    return int(total)
