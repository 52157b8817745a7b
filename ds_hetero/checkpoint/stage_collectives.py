"""DeepSpeed's checkpoint save with its world collectives confined to the saving stage's ranks.

`DeepSpeedEngine.save_checkpoint` calls `deepspeed.comm.barrier()` (around the write) and
`all_reduce` (the tag check's two) on the default, world group. Every rank of the world then has
to make the same calls, which holds only while every rank saves exactly one DeepSpeed engine: with
disaggregated placement, the ranks of a stage whose experts are sharded over ep save through
ds_hetero's own files (expert_state.py) and call no DeepSpeed save, so the other stage's world
barrier would wait for them forever. Within the call, a `barrier` or `all_reduce` given no group
runs on the saving stage's own group instead, every rank of which makes the same save: the same
ordering guarantees, among the ranks that share the checkpoint's files. DeepSpeed offers no
per-call group for these, hence the narrow swap of the two module attributes for one call
(patches.py's table), restored when it returns.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def collectives_on(group) -> Iterator[None]:
    """Around one DeepSpeed call: its group-less `barrier` / `all_reduce` run on `group`."""
    import deepspeed.comm as ds_comm

    barrier, all_reduce = ds_comm.barrier, ds_comm.all_reduce

    def confined_barrier(*args, **kwargs):
        if not args and kwargs.get("group") is None:  # barrier(group=None, ...)
            kwargs["group"] = group
        return barrier(*args, **kwargs)

    def confined_all_reduce(*args, **kwargs):
        if len(args) < 3 and kwargs.get("group") is None:  # all_reduce(tensor, op, group=None, ...)
            kwargs["group"] = group
        return all_reduce(*args, **kwargs)

    ds_comm.barrier, ds_comm.all_reduce = confined_barrier, confined_all_reduce
    try:
        yield
    finally:
        ds_comm.barrier, ds_comm.all_reduce = barrier, all_reduce
