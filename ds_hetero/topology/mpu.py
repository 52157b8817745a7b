"""DeepSpeed's `mpu` protocol over one stage's process groups, and the stage context.

DeepSpeed 0.19 asks the `mpu` passed to `deepspeed.initialize` for its model-, data- and
sequence-parallel groups (call sites in shared/reference/deepspeed-hf-integration.md §1.2).
`StageMPU` answers for one stage:

- model parallel = tensor parallel = the stage's tp group (grad-norm all-reduce; sharded
  params carry `tensor_model_parallel` so each is counted once);
- data parallel = the stage's dp group (batch arithmetic: train_batch = micro * gas * dp);
- sequence parallel = the stage's cp group and sequence-data parallel = dp x cp: DeepSpeed
  then reduces gradients over dp x cp (cp ranks hold partial gradients of replicated
  parameters) and divides by dp only, which is the sum over cp and mean over dp we need.

Deliberately absent: `initialize_sequence_parallel`. DeepSpeed treats any mpu with that
attribute as its Ulysses module and then ignores the model-parallel group.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch.distributed as dist

from .groups import StageGroups


class StageMPU:
    """The mpu of one stage held by this rank."""

    def __init__(self, groups: StageGroups):
        if not groups.is_member:
            raise ValueError(
                f"rank {groups.rank} holds no part of stage {groups.layout.name!r}; "
                "only ranks of a stage build its engine"
            )
        self.groups = groups
        self.layout = groups.layout
        self._coord = groups.coord

    @property
    def stage(self) -> str:
        return self.layout.name

    def __repr__(self) -> str:
        return f"StageMPU({self.stage!r}, {self.layout.shape}, rank={self.groups.rank}, coord={tuple(self._coord)})"

    # ---------------------------------------------------------------- model / tensor parallel
    def get_model_parallel_group(self):
        return self.groups.tp

    def get_model_parallel_world_size(self) -> int:
        return self.layout.tp

    def get_model_parallel_rank(self) -> int:
        return self._coord.tp

    def get_tensor_model_parallel_group(self):
        return self.groups.tp

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.layout.tp

    def get_tensor_model_parallel_rank(self) -> int:
        return self._coord.tp

    def get_tensor_model_parallel_src_rank(self) -> int:
        """Global rank of tp-rank 0 in this rank's tp group."""
        return self.groups.ranks_of["tp"][0]

    # ---------------------------------------------------------------- data parallel
    def get_data_parallel_group(self):
        return self.groups.dp

    def get_data_parallel_world_size(self) -> int:
        return self.layout.dp

    def get_data_parallel_rank(self) -> int:
        return self._coord.dp

    def get_data_parallel_group_ranks(self) -> list[int]:
        return list(self.groups.ranks_of["dp"])

    # ---------------------------------------------------------------- sequence (context) parallel
    def get_sequence_parallel_group(self):
        return self.groups.cp

    def get_sequence_parallel_world_size(self) -> int:
        return self.layout.cp

    def get_sequence_parallel_rank(self) -> int:
        return self._coord.cp

    def get_sequence_data_parallel_group(self):
        return self.groups.dp_cp

    def get_sequence_data_parallel_world_size(self) -> int:
        return self.layout.dp * self.layout.cp

    def get_sequence_data_parallel_rank(self) -> int:
        return dist.get_rank(group=self.groups.dp_cp)

    # ---------------------------------------------------------------- pipeline (the language stage's pp)
    # Each pipeline stage has its own engine; DeepSpeed reads these for its checkpoint metadata
    # (engine.py: CHECKPOINT_PP_DEGREE) and for MoE norms only, so no engine reduces over them.
    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.layout.pp

    def get_pipeline_model_parallel_rank(self) -> int:
        return self._coord.pp

    def get_pipeline_model_parallel_group(self):
        return self.groups.pp

    def get_pipe_parallel_world_size(self) -> int:
        return self.layout.pp

    def get_pipe_parallel_rank(self) -> int:
        return self._coord.pp

    def get_pipe_parallel_group(self):
        return self.groups.pp


@contextlib.contextmanager
def stage_context(mpu: StageMPU) -> Iterator[StageMPU]:
    """Point DeepSpeed's process-global `groups.mpu` at this stage for the duration.

    Why: `deepspeed.initialize(mpu=...)` stores the mpu in the module global
    `deepspeed.utils.groups.mpu`, and the last engine built wins. ZeRO stage 0 re-reads it at
    gradient-reduction time (`_reduce_non_expert_gradients`), so without this the first
    stage's gradients would be averaged over the other stage's dp group. Wrap every engine
    call (forward, backward, step, checkpointing) in the context of the engine's stage.
    """
    from deepspeed.utils import groups as ds_groups

    previous = ds_groups.mpu
    ds_groups.mpu = mpu
    try:
        yield mpu
    finally:
        ds_groups.mpu = previous
