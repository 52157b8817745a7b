"""The experts of one MoE block, sharded over the stage's ep group (each rank: E / ep of them).

`ExpertParallelExperts` takes the place of a Hugging Face fused-experts module (Qwen3-VL-MoE's
`Qwen3VLMoeTextExperts`: `gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`) inside the HF MoE
block, with the same call (`hidden [T, H], top_k_index [T, K], top_k_weights [T, K]`) and the
same parameter names, holding experts [r * E/ep, (r + 1) * E/ep) of ep rank r (dim 0 sliced).
The HF block keeps its own router (`gate`), so routing is exactly the model's: softmax in fp32,
top-k, the top-k weights renormalised; the router's logits are what its OutputRecorder captures
for the load-balancing loss (aux_loss.py).

Why not AutoEP's `AutoEPMoELayer`: it rebuilds the router and renames the expert weights
(`router.gate.weight`, `experts.w1/w2/w3`), while ds_hetero loads, saves and compares every weight
per shard by its Hugging Face name; and it sizes its groups from the world
(`set_deepspeed_parallelism` -> `groups._create_expert_and_data_parallel`, refusing an mpu with
tp != 1). So this class keeps the HF block and its names and uses AutoEP's exchange
(dispatch.py) over the stage's own groups. It subclasses `AutoEPMoELayer` only as the marker
DeepSpeed's engine looks for (`has_moe_layers`: expert gradients reduced over the named
expert-data-parallel group, ZeRO's MoE parameter groups); its `__init__` and `forward` are its own,
and `set_deepspeed_parallelism` does nothing: the groups were built with every other group
(topology/groups.py) and registered under this stage's name (zero.py).
"""

from __future__ import annotations

import torch
from deepspeed.module_inject.auto_ep_layer import AutoEPMoELayer
from torch import nn

from ..tensor_parallel.sequence_parallel import add_grad_hook
from .dispatch import combine, dispatch, route


class ExpertParallelExperts(AutoEPMoELayer):
    def __init__(self, experts: nn.Module, group, ep: int, ep_rank: int, group_name: str, edp_group=None):
        nn.Module.__init__(self)  # not AutoEPMoELayer's: see the module docstring
        self.num_experts = experts.num_experts
        self.num_local_experts = experts.num_experts // ep
        self.ep_size, self.ep_rank, self.ep_group, self.ep_group_name = ep, ep_rank, group, group_name
        self.act_fn = experts.act_fn
        if hasattr(experts, "is_transposed"):  # PEFT's ParamWrapper reads the layout of the expert weights
            self.is_transposed = experts.is_transposed
        mine = slice(ep_rank * self.num_local_experts, (ep_rank + 1) * self.num_local_experts)
        self.gate_up_proj = nn.Parameter(experts.gate_up_proj.data[mine].clone(),
                                         requires_grad=experts.gate_up_proj.requires_grad)
        self.down_proj = nn.Parameter(experts.down_proj.data[mine].clone(), requires_grad=experts.down_proj.requires_grad)
        for p, old in ((self.gate_up_proj, experts.gate_up_proj), (self.down_proj, experts.down_proj)):
            mark_expert_parameter(p, group, group_name, experts.num_experts, ep_rank, edp_group, ep=ep)
            # under sequence parallelism the tp ranks route different tokens through replicated
            # experts: the hooks that sum the HF weights' gradients over tp (sequence_parallel.py)
            for hook in getattr(old, "grad_hooks", ()):
                add_grad_hook(p, hook)
            if getattr(old, "sequence_parallel", False):
                p.sequence_parallel = True
        self.router = route  # replaced by the negative controls only

    def set_deepspeed_parallelism(self, *args, **kwargs) -> None:
        """The groups are the stage's own (see the module docstring)."""

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        rows, d = dispatch(hidden_states, top_k_index, self.num_experts, self.ep_group, self.ep_size, self.router)
        out = self.local_experts(rows, d.local_expert)
        return combine(out, d, top_k_weights, self.ep_group).to(hidden_states.dtype)

    def local_experts(self, rows: torch.Tensor, local_expert: torch.Tensor) -> torch.Tensor:
        """Each row through its expert's gated MLP, as the HF experts compute it (weights after combine).
        An expert that got no rows still runs (on none): `act_fn` is a submodule, and ZeRO 3 checks
        that every rank calls the same submodules in the same order, whatever its routing."""
        out = torch.zeros_like(rows)
        for e in range(self.num_local_experts):
            idx = torch.nonzero(local_expert == e).flatten()
            gate, up = nn.functional.linear(rows[idx], self.gate_up_proj[e]).chunk(2, dim=-1)
            out = out.index_add(0, idx, nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e]))
        return out


def mark_expert_parameter(p: nn.Parameter, group, group_name: str, num_experts: int, ep_rank: int,
                          edp_group=None, *, ep: int, dim: int = 0, outer: int = 1) -> None:
    """The tags DeepSpeed (`allreduce`, `group_name`: reduce over the named expert-data-parallel
    group) and ds_hetero (gather for checkpoints and save_pretrained, count once in the norm) read.
    `dim`, `outer`: where the experts are in the tensor (gather.py; dim 0 for the expert weights)."""
    p.allreduce = False
    p.ep_size, p.ep_dim, p.ep_outer = ep, dim, outer
    p.group_name = group_name
    p.expert_parallel = True
    p.ep_group = group
    p.ep_full_size = num_experts  # the experts of the full tensor (gather.py: where they are)
    p.ep_rank = ep_rank  # holds experts [ep_rank * E/ep, (ep_rank + 1) * E/ep) (weights/shard_slices.py)
    # ZeRO 3 partitions an AutoEP expert over its expert-data-parallel group (as AutoEP tags its own)
    p.ds_zero_placement_family = "autoep_expert"
    p.ds_zero_partition_group_name = group_name
    if edp_group is not None:
        p.ds_zero_partition_process_group = edp_group


def is_expert_parameter(p) -> bool:
    return getattr(p, "expert_parallel", False)
