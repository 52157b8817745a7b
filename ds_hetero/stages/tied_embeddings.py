"""Tied input/output embeddings with a pipelined language stage: two copies, one gradient.

With pp 1 the tie is one parameter used twice, and autograd sums both gradients into it
(tensor_parallel/embedding.py). With pp > 1 the input embedding lives on the first pipeline
stage and the head on the last, on different ranks, so each holds its own copy of the tied weight
(its tp rows of it), both taken from the same tensor (the same seeded model, or the same
checkpoint entry). Megatron's scheme keeps them equal:

- after each step's backward (every micro-batch, and DeepSpeed's reduction over the chunk's dp
  group) and before the gradient norm, the two copies' gradients are summed over the
  *embedding group* (topology/embedding_group.py: the first and the last pipeline stage's rank
  of each (tp, cp, dp) coordinate): both copies then hold the gradient of the one tied weight,
  the sum of its two uses; this is DeepSpeed's own `ReduceTiedGrads` pipeline instruction,
  issued by schedule/pipeline.py at the end of the step's work;
- both copies then take identical steps from identical optimizer states (weight decay and
  clipping alike), so they stay equal, step after step;
- the last pipeline stage's copy carries `SHARED_COPY`: the gradient norm leaves it out, so the
  tied weight counts once (Megatron's `shared` attribute), and `save_pretrained` writes the
  first pipeline stage's copy only (one tensor, as transformers writes a tied model).

Where the gradient is at that point depends on the ZeRO stage:
  ZeRO 0 (fp32 torch optimizer)  `param.grad`, already averaged over the dp group
  ZeRO 1 / 2                     the rank's dp partition of its flat gradient buffer
                                 (`averaged_gradients[group]`, what the norm and the step read)
ZeRO 1/2 flatten each optimizer param group and cut it into dp partitions; on the first and
the last pipeline stage the tied weight sits at different offsets of their flat buffers, so
its partitions would not line up. The tied copy therefore gets an optimizer param group of its
own on both pipeline stages (`param_groups`): partition d of that group is the same elements
on both, and the sum is one all-reduce of each rank's partition (Megatron puts the shared
embedding in a bucket of its own for the same reason). ZeRO 3 and optimizer offload with a
tied pipelined stage are refused by validation.py (the partitions live elsewhere there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..topology.embedding_group import EmbeddingGroup, build_embedding_group

SHARED_COPY = "ds_hetero_shared_copy"  # on the last pipeline stage's copy: not in the norm, not saved


@dataclass(frozen=True)
class TiedCopy:
    """This rank's copy of the tied weight: the embedding's (first pipeline stage) or the head's (last)."""

    param: nn.Parameter
    group: EmbeddingGroup
    shared: bool  # the head's copy on the last pipeline stage


def is_shared_copy(param: torch.Tensor) -> bool:
    return getattr(param, SHARED_COPY, False)


def tied_copy(layout, rank: int, cache, chunk, tied: bool) -> TiedCopy | None:
    """Build the embedding group (on every rank: collective) and return this rank's copy, or
    None (untied model, no pipeline, a middle pipeline stage, a rank without the language stage).

    `tied`: whether the model's head and embedding were one parameter before the cut, the same on
    every rank. `chunk`: this rank's PipelineChunk (None where it holds no language stage)."""
    if not tied or layout.pp < 2:
        return None
    group = build_embedding_group(layout, rank, cache)
    if chunk is None or not group.is_member:
        return None
    if chunk.is_first:
        return TiedCopy(chunk.embed.weight, group, shared=False)
    param = chunk.lm_head.weight
    setattr(param, SHARED_COPY, True)
    return TiedCopy(param, group, shared=True)


def param_groups(trainable: Sequence[nn.Parameter], copy: TiedCopy | None) -> list[Any]:
    """The optimizer's parameters: the tied copy in a param group of its own (see the module
    docstring), or `trainable` unchanged."""
    if copy is None or not any(p is copy.param for p in trainable):
        return list(trainable)
    rest = [p for p in trainable if p is not copy.param]
    return ([{"params": rest}] if rest else []) + [{"params": [copy.param]}]


def _zero12_group(opt, param) -> int:
    for i, group in enumerate(opt.bit16_groups):
        if any(p is param for p in group):
            if len(group) != 1:  # param_groups() gave it its own group; anything else misaligns partitions
                raise RuntimeError("the tied embedding copy shares a ZeRO param group with other parameters")
            return i
    raise RuntimeError("the tied embedding copy is not in the stage's ZeRO optimizer")


def gradient_pieces(engine, param) -> list[torch.Tensor]:
    """The tensors that hold this rank's (dp-reduced) gradient of `param` at the step boundary."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    opt = engine.optimizer
    if isinstance(opt, DeepSpeedZeroOptimizer):
        if opt.cpu_offload:
            raise RuntimeError("a tied pipelined language stage with optimizer offload is not supported")
        pieces = opt.averaged_gradients[_zero12_group(opt, param)]
        return [t for t in pieces if t.numel()]
    if isinstance(opt, DeepSpeedZeroOptimizer_Stage3):
        raise RuntimeError("a tied pipelined language stage with ZeRO 3 is not supported")
    if param.grad is None:  # no use of the weight this step: its gradient is zero
        param.grad = torch.zeros_like(param)
    return [param.grad]


def reduce_tied_gradients(stage) -> None:
    """Sum the two copies' gradients over the embedding group (DeepSpeed's ReduceTiedGrads);
    a no-op on a rank without a tied copy. Both ranks of a pair hold the same shapes and
    partitions, so they issue the same all-reduces in the same order."""
    copy = getattr(stage, "tied", None)
    if copy is None or not stage.trains or not copy.param.requires_grad:
        return
    with stage.context():
        for grad in gradient_pieces(stage.engine, copy.param):
            dist.all_reduce(grad, group=copy.group.group)


def zero12_norm_without_shared(opt) -> torch.Tensor | None:
    """A ZeRO 1/2 stage's gradient norm leaving out every param group made only of shared copies
    (as DeepSpeed's `scaled_global_norm`, group by group); None when there is none to leave out."""
    from deepspeed.runtime.utils import combine_grad_norm_groups

    skip = {i for i, group in enumerate(opt.bit16_groups) if group and all(is_shared_copy(p) for p in group)}
    if not skip:
        return None
    if opt.cpu_offload:
        raise RuntimeError("a tied pipelined language stage with optimizer offload is not supported")
    norms = [opt.get_grad_norm_direct(opt.averaged_gradients[i], opt.params_in_partition[i])
             for i in range(len(opt.bit16_groups)) if i not in skip]
    if not norms:
        return torch.zeros((), dtype=torch.float32)
    return combine_grad_norm_groups(norms)
