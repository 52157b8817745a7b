"""PEFT LoRA on the fused expert weights, sharded over ep with the experts.

    LoraConfig(r=8, target_modules=[...], target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])

PEFT 0.21 cannot reach the experts through `target_modules` (Qwen3-VL-MoE's experts are one module
holding 3-D parameters, not Linear layers); `target_parameters` wraps the experts module in a
`ParamWrapper` per targeted parameter (nested: the last one outermost), each holding
`lora_A = Linear(in, r E)` and `lora_B = Linear(r E, out)`. In the forward a wrapper parametrizes its
weight as `W + scaling * (B_e A_e)` per expert, with `A.weight` read as `(E, r, in)` and `B.weight`
as `(out, r, E)` (`ParamWrapper.get_delta_factors`), and calls the experts module inside.

Under ep the experts module is replaced by this rank's `ExpertParallelExperts` (E / ep experts),
inside the wrappers. Each wrapper keeps the factors of the same experts, and `num_experts` E / ep,
so PEFT's own delta is exactly those experts' rows of the single process's delta: of `A` the r rows
of each of them (dim 0, expert-major), of `B` their columns (dim 1, where the expert is the fastest
index: `outer` r, gather.py). The factors are tagged as expert parameters (`mark_expert_parameter`):
their gradients come from the tokens the ep group routes to those experts, and are reduced over the
expert-data-parallel group like the expert weights; checkpoints, `save_pretrained` and the adapter
export gather them over ep by those tags. Over tp they are replicated, as the experts are.
"""

from __future__ import annotations

from torch import nn

from .gather import expert_block
from .layers import mark_expert_parameter


def expert_wrappers(root: nn.Module, experts: nn.Module) -> list[nn.Module]:
    """PEFT's ParamWrappers whose innermost base layer is `experts` (one per targeted parameter)."""
    return [m for m in root.modules() if type(m).__name__ == "ParamWrapper"
            and getattr(m, "get_base_layer", None) is not None and m.get_base_layer() is experts]


def lora_b_outer(r: int) -> int:
    """`outer` of B's dim 1 (r: the expert is its fastest index); one function, so that a negative
    control can slice B as if the experts were contiguous."""
    return r


def _local(linear: nn.Linear, dim: int, outer: int, slot: int, ep: int, tags: dict) -> None:
    weight = linear.weight
    local = nn.Parameter(expert_block(weight.data, dim, outer, slot, ep), requires_grad=weight.requires_grad)
    linear.weight = local
    if dim == 0:
        linear.out_features = local.shape[0]
    else:
        linear.in_features = local.shape[1]
    mark_expert_parameter(local, dim=dim, outer=outer, **tags)


def shard_expert_lora(wrapper: nn.Module, ep: int, ep_rank: int, tags: dict) -> None:
    """Keep this rank's experts' LoRA factors in `wrapper` (see the module docstring)."""
    experts = wrapper.num_experts
    for name in list(wrapper.lora_A):
        r = wrapper.r[name]
        _local(wrapper.lora_A[name], 0, 1, ep_rank, ep, tags)
        _local(wrapper.lora_B[name], 1, lora_b_outer(r), ep_rank, ep, tags)
    wrapper.num_experts = experts // ep
