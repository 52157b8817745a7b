"""ZeRO 3 on a context-parallel language stage: two places where DeepSpeed 0.19 leaves out cp.

The cp ranks of a language dp replica hold partial gradients of every parameter (each saw its
own sequence shard), so the gradient a parameter needs is the sum over cp and the mean over dp:
reduce over dp x cp and divide by dp. DeepSpeed says so through the mpu's sequence-parallel size
(topology/mpu.py): ZeRO 1 and 2 reduce over the sequence-data-parallel group (dp x cp) and
divide by `dp*cp / cp` (`stage_1_and_2.py`, `average_tensor`). ZeRO 3 does not, twice:

1. Partition group. `DeepSpeedZeRoOffload._convert_to_zero_parameters` (parameter_offload.py)
   partitions every parameter over `mpu.get_data_parallel_group()`, the dp group, while the
   ZeRO-3 optimizer is built over the sequence-data-parallel group (engine.py passes
   `dp_process_group=self.seq_data_parallel_group`; `partition_count` = dp x cp). The
   reduce-scatter runs over the parameter's own group (`ds_process_group`, dp only), so the cp
   partial gradients are never summed, and the optimizer's dp x cp partitions do not line up
   with the parameters' dp partitions: whole parameters end with no update at all. (DeepSpeed's
   own Ulysses mpu has no `get_data_parallel_group`, so it partitions over the world, which is
   dp x sp there.) Fix: partition the stage's parameters ourselves, before
   `deepspeed.initialize`, with `deepspeed.zero.Init(module=..., data_parallel_group=dp x cp)`;
   DeepSpeed keeps parameters that are already ZeRO parameters.
2. Average. On the reduce-scatter path (`__avg_scatter_grads`, the default:
   `zero_optimization.reduce_scatter` true) `reduce_scatter_coalesced` pre-divides by the whole
   group, dp x cp, and the only correction after it scales by `partition_world_size /
   _gradient_averaging_world_size(...)` (written for expert parallelism); its contiguous-bucket
   path does divide by `averaging_world_sz / sequence_parallel_size`. Fix: on the stage's
   optimizer instance `_gradient_averaging_world_size` returns the partition size divided by
   cp, so the reduce-scatter result is multiplied by cp. The contiguous path would then divide
   twice, so the config check refuses `zero_optimization.reduce_scatter: false` with ZeRO 3 and
   cp > 1 (validation.py).

With sequence parallelism alone (cp 1) neither applies: the partition group is the dp group,
and the tp ranks' partial gradients of the replicated parameters are summed by ds_hetero's own
hooks (tensor_parallel/sequence_parallel.py) before DeepSpeed sees them.
"""

from __future__ import annotations


def correct_sequence_average(engine, cp: int) -> bool:
    """Make a ZeRO-3 engine's reduce-scatter average over dp, not dp x cp; whether it applied."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    opt = engine.optimizer
    if cp == 1 or not isinstance(opt, DeepSpeedZeroOptimizer_Stage3):
        return False
    if not opt.reduce_scatter:  # refused by the config check; never run a silently wrong average
        raise RuntimeError("ZeRO 3 with cp > 1 needs zero_optimization.reduce_scatter true")
    averaging = type(opt)._gradient_averaging_world_size

    def per_dp(params, partition_world_size):
        return averaging(opt, params, partition_world_size) // cp

    opt._gradient_averaging_world_size = per_dp  # instance attribute: this stage's optimizer only
    return True


def partition_over_sequence_shards(module, groups, mpu, ds_config: dict, cp: int) -> bool:
    """Partition a ZeRO-3 stage's parameters over dp x cp (point 1 above); whether it applied."""
    if cp == 1 or ds_config.get("zero_optimization", {}).get("stage") != 3:
        return False
    import deepspeed

    deepspeed.zero.Init(module=module, data_parallel_group=groups.dp_cp, config_dict_or_path=ds_config, mpu=mpu)
    return True
