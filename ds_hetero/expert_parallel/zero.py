"""What DeepSpeed needs to reduce expert gradients over the stage's expert-data-parallel group.

DeepSpeed's engine keeps its expert groups in process-wide dicts of `deepspeed.utils.groups`
(`_EXPERT_PARALLEL_GROUP`, `_EXPERT_DATA_PARALLEL_GROUP`, by group name), and reduces every
parameter tagged `allreduce=False` over `_EXPERT_DATA_PARALLEL_GROUP[param.group_name]`, averaging
by the (dense) data-parallel size: exactly the semantics ds_hetero needs (an expert's gradient
arrives from the tokens of its whole ep group; summed over the expert-data-parallel group it
covers every dp x cp rank's tokens once, and the dense division by dp matches the dense
parameters' scaling, step/plan.py `language_scale`). Its own group builder is world-shaped, so
ds_hetero registers the stage's groups, built with every other group (topology/groups.py), under
a name of its own (`group_name`): one entry per process (a process holds one language stage).
Recorded in ds_hetero/patches.py; `unregister` removes it.

ZeRO: DeepSpeed's ZeRO 1/2 partitions an optimizer group marked `moe` over its named
expert-data-parallel group (`expert_param_groups` builds those groups, as DeepSpeed does for an
optimizer it builds itself); stage 0 reduces expert gradients over the same group; ZeRO 3
partitions each expert weight over it (`ds_zero_partition_process_group`, with AutoEP's placement
tags: layers.py `mark_expert_parameter`) and the dense weights over the stage's dp group.
"""

from __future__ import annotations


def group_name(stage: str, ep: int) -> str:
    return f"ds_hetero.{stage}.ep{ep}"


def register(name: str, ep_group, edp_group, ep_ranks, edp_ranks) -> None:
    from deepspeed.utils import groups

    groups._EXPERT_PARALLEL_GROUP[name] = ep_group
    groups._EXPERT_PARALLEL_GROUP_RANKS[name] = list(ep_ranks)
    groups._EXPERT_DATA_PARALLEL_GROUP[name] = edp_group
    groups._EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = list(edp_ranks)


def unregister(name: str) -> None:
    from deepspeed.utils import groups

    for table in (groups._EXPERT_PARALLEL_GROUP, groups._EXPERT_PARALLEL_GROUP_RANKS,
                  groups._EXPERT_DATA_PARALLEL_GROUP, groups._EXPERT_DATA_PARALLEL_GROUP_RANKS):
        table.pop(name, None)


def expert_param_groups(params, module=None, zero_stage: int = 0):
    """The optimizer's parameter groups with the expert parameters in groups of their own, marked
    `moe` and named by their expert-data-parallel group (DeepSpeed's
    `split_params_into_different_moe_groups_for_optimizer`, which its ZeRO 1/2 require); the
    parameters unchanged when none is an expert.

    ZeRO 1/2 refuse a model with MoE layers and no MoE optimizer group: frozen experts (every
    expert weight `requires_grad=False`) are refused there by name, on every rank alike."""
    from deepspeed.moe.utils import configure_moe_param_groups, is_moe_param

    from ..errors import HeteroConfigError

    params = list(params)
    flat = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    if not any(is_moe_param(p) for p in flat):
        has_experts = module is not None and any(is_moe_param(p) for p in module.parameters())
        if has_experts and zero_stage in (1, 2):
            raise HeteroConfigError(
                "hetero_parallel.stages.language.freeze", f"every expert weight is frozen, which DeepSpeed's ZeRO "
                f"{zero_stage} refuses for a model with MoE layers (it needs an optimizer group of experts); use "
                "ZeRO 0 or 3 for the language stage (stages.language.zero_stage), or train the experts")
        return params
    return configure_moe_param_groups(params)
