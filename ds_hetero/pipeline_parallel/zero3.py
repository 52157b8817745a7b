"""ZeRO 3 with a pipelined language stage (pp > 1): two places where DeepSpeed 0.19's ZeRO 3
assumes one forward, then one backward, on every rank of the world at once.

1. The parameter-trace check, confined to the ranks that gather together (below).
2. The count of micro-steps (`count_backward`, at the end).

Each pipeline stage (chunk) is its own DeepSpeed engine whose module is only that chunk, so ZeRO 3
partitions, gathers and reduce-scatters every chunk parameter over the chunk's own data-parallel
group (dp, or dp x cp: context_parallel/zero3.py); the point-to-point sends between chunks are
outside the engine and never touch a ZeRO parameter. Everything ZeRO 3 does per parameter is
therefore already inside one pipeline stage, except one check:

`PartitionedParameterCoordinator.reset_step` (deepspeed/runtime/zero/partitioned_param_coordinator.py,
DeepSpeed 0.19) runs at the start of each of the engine's forwards until its trace is complete
(the first two, and again after a trace is invalidated) and calls
`assert_ints_same_as_other_ranks`, which broadcasts the recorded submodule and parameter order
from global rank 0 over the WORLD group (`deepspeed.runtime.zero.utils`, `group=None`). With a
pipeline that fails twice: the pipeline stages reach their forwards at different times (1F1B,
with blocking receives in between: a world collective there deadlocks), and their chunks hold
different modules (the lists differ, so the check would raise even if every rank joined). What
the check means to protect (every rank that gathers a parameter with this rank fetches the same
parameters in the same order) concerns the chunk's data-parallel group only. So the chunk
engine's coordinator runs the same check over that group, from its first rank.

How: `reset_step` looks the function up in its module's namespace when it runs; the chunk
engine's coordinator gets an instance-level `reset_step` that puts the group's version there for
the duration of the call and restores the original after it (single-threaded, so no other caller
sees it). It is applied to every engine of a pipelined run: an encoder in first_stage placement
runs on pipeline stage 0's ranks only, where a world broadcast would hang the same way.
Without a pipeline nothing changes. Cost: the trace is re-recorded (and checked) whenever the
order of fetches differs between two forwards, which 1F1B and the encoders' phases make common;
DeepSpeed's own check would run as often, over the world.

Micro-steps: ZeRO 3 accumulates a parameter's gradient partition by copy while
`micro_step_id == 0` and by addition after it (stage3.py, `partition_grads`), and 0.19 increments
`micro_step_id` at the start of the NEXT forward (`clear_backward_seen_flag`, called by
`DeepSpeedEngine.forward`), not at the end of a backward. A pipeline runs backwards back to back:
1F1B's cool-down (pp 4, 4 micro-batches: stage 0 runs B1 B2 B3 after B0 with no forward between)
and the colocated encoders' passes (every forward in phase 1, every backward in phase 3). Each
of those backwards would copy over the previous one's gradient, and the step would keep only the
last micro-batch's. `count_backward` calls `clear_backward_seen_flag` after each backward that is
not the step's last, which is exactly what the next forward would do; the next forward's own call
then finds nothing to count.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _same_in_group(ints: list[int], group) -> None:
    """`assert_ints_same_as_other_ranks` over `group`: every rank's list equals its first rank's."""
    src = dist.get_global_rank(group, 0)
    device = torch.device("cpu") if dist.get_backend(group) == "gloo" else _device()
    length = torch.tensor([len(ints)], dtype=torch.long, device=device)
    dist.broadcast(length, src=src, group=group)
    if int(length.item()) != len(ints):
        raise RuntimeError(f"ZeRO-3 trace: rank {dist.get_rank()} recorded {len(ints)} entries, rank {src}, which "
                           f"gathers its parameters with it, recorded {int(length.item())}")
    theirs = torch.tensor(ints, dtype=torch.long, device=device)
    dist.broadcast(theirs, src=src, group=group)
    theirs = theirs.tolist()
    if theirs != list(ints):
        at = next(i for i, (a, b) in enumerate(zip(ints, theirs)) if a != b)
        raise RuntimeError(f"ZeRO-3 trace: rank {dist.get_rank()} fetched its parameters in another order than rank "
                           f"{src}, which gathers them with it (first difference at entry {at} of {len(ints)}: "
                           f"{ints[at]} != {theirs[at]})")


def _device() -> torch.device:
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())


def confine_trace_check(engine, group) -> bool:
    """Make a ZeRO-3 chunk engine check its parameter trace over `group` (the chunk's ZeRO
    partition group), not over the world; whether it applied."""
    from deepspeed.runtime.zero import partitioned_param_coordinator as coordinator_module
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    opt = engine.optimizer
    if isinstance(opt, DeepSpeedZeroOptimizer_Stage3):
        offload = opt.parameter_offload
    elif isinstance(opt, DeepSpeedZeRoOffload):  # a frozen stage: ZeRO 3 without an optimizer
        offload = opt
    else:
        return False
    coordinator = offload.get_param_coordinator()
    reset_step = coordinator.reset_step  # DeepSpeed's, bound to this coordinator

    def in_group(ints):
        _same_in_group(ints, group)

    def confined_reset_step():
        original = coordinator_module.assert_ints_same_as_other_ranks
        coordinator_module.assert_ints_same_as_other_ranks = in_group
        try:
            return reset_step()
        finally:
            coordinator_module.assert_ints_same_as_other_ranks = original

    coordinator.reset_step = confined_reset_step  # instance attribute: this engine only
    return True


def count_backward(engine) -> bool:
    """ZeRO 3: count the backward just run as a micro-step now (see the module docstring); whether
    it applied. Other ZeRO stages accumulate into `.grad` or their own buckets: unchanged."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    opt = engine.optimizer
    if not isinstance(opt, DeepSpeedZeroOptimizer_Stage3):
        return False
    opt.clear_backward_seen_flag()
    return True
