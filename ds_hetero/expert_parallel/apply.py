"""Sharding a model's experts over the language stage's ep group, and handing over the aux loss."""

from __future__ import annotations

from torch import nn

from .aux_loss import add_stage_stats, aux_of_stats, global_aux_term, per_rank_aux, stage_stats
from .layers import ExpertParallelExperts
from .lora import expert_wrappers, shard_expert_lora
from .zero import group_name, register


def fused_experts(root: nn.Module):
    """(parent, attribute, module) of every Hugging Face fused-experts module under `root`: a
    module with 3-D `gate_up_proj` / `down_proj` and `num_experts` (Qwen3-VL-MoE, Qwen3-MoE)."""
    for name, module in list(root.named_modules()):
        if isinstance(module, ExpertParallelExperts):
            continue
        if all(hasattr(module, a) for a in ("gate_up_proj", "down_proj", "num_experts")) and \
                getattr(module.gate_up_proj, "ndim", 0) == 3:
            parent_name, _, attr = name.rpartition(".")
            yield root.get_submodule(parent_name), attr, module


def apply_expert_parallel(root: nn.Module, groups, stage: str = "language") -> int:
    """Replace every fused-experts module under `root` by this rank's ep shard of it (no
    communication: each rank slices identical full weights; PEFT LoRA factors of the expert
    weights with them, lora.py), and register the stage's groups
    with DeepSpeed (zero.py). Returns how many modules were replaced."""
    layout = groups.layout
    name = group_name(stage, layout.ep)
    register(name, groups.ep, groups.edp, groups.ranks_of["ep"], groups.ranks_of["edp"])
    ep_rank = layout.ep_rank(groups.rank)
    tags = dict(group=groups.ep, group_name=name, ep_rank=ep_rank, edp_group=groups.edp, ep=layout.ep)
    n = 0
    for parent, attr, experts in list(fused_experts(root)):
        wrappers = expert_wrappers(root, experts)  # PEFT LoRA on the expert weights (lora.py)
        setattr(parent, attr, ExpertParallelExperts(experts, groups.ep, layout.ep, ep_rank, name, groups.edp))
        for wrapper in wrappers:
            shard_expert_lora(wrapper, layout.ep, ep_rank, dict(tags, num_experts=experts.num_experts))
        n += 1
    return n


class RouterLogits:
    """What a MoE language stage's forward leaves for the loss: its router logits (one [T, E]
    tensor per MoE layer), the padding mask of its tokens, and the aux-loss settings."""

    def __init__(self, logits, mask, top_k: int, num_experts: int, coef: float):
        self.logits, self.mask, self.top_k, self.num_experts, self.coef = logits, mask, top_k, num_experts, coef


def share_over_tp(term, tp_group):
    """Under sequence parallelism each tp rank's term covers its own tokens: the value becomes the
    tp ranks' sum (identical on each, as the lm loss is), the gradient stays each rank's own term's
    (the sums over tp of the replicated weights' gradients are their grad hooks')."""
    import torch.distributed as dist

    total = term.detach().clone()
    dist.all_reduce(total, group=tp_group)
    return term + (total - term.detach())


def take_aux_loss(module: nn.Module, groups=(), group_size: int = 1, tp_group=None):
    """This rank's share of the micro-batch's aux loss (aux_loss.py, not yet weighted by
    `router_aux_loss_coef`), or None for a stage without router logits. Consumes what the forward left (one forward, one loss).
    `groups`: those whose ranks' tokens the aux loss counts (aux_group in schedule/stage_work.py).
    `module.aux_rule = "per_rank"` computes the wrong, per-rank rule (a negative control only)."""
    pending = getattr(module, "router_logits", None)
    if pending is None:
        return None
    module.router_logits = None
    if getattr(module, "aux_rule", "global") == "per_rank":
        term = per_rank_aux(pending.logits, pending.mask, pending.top_k, pending.num_experts) / group_size
    else:
        term = global_aux_term(pending.logits, pending.mask, pending.top_k, pending.num_experts, groups)
    return term if tp_group is None else share_over_tp(term, tp_group)


def carry_router_stats(module: nn.Module, incoming, num_experts: int, device, groups=(), stages: int = 1):
    """A pipeline stage's router statistics to send on (aux_loss.py): the `incoming` ones (None on
    the first stage) plus those of the layers this chunk just ran. Consumes what the forward left.
    `module.aux_rule = "per_stage"`: each stage's aux loss over its own layers (a negative control)."""
    pending = getattr(module, "router_logits", None)
    module.router_logits = None
    local = stage_stats(() if pending is None else pending.logits, None if pending is None else pending.mask,
                        0 if pending is None else pending.top_k, num_experts, device)
    return add_stage_stats(incoming, local, num_experts, getattr(module, "aux_rule", "global"), groups, stages)


def aux_of_carried(stats, num_experts: int, groups=(), tp_group=None):
    """The last pipeline stage: this rank's share of the micro-batch's aux loss from every layer's sums."""
    term = aux_of_stats(stats, num_experts, groups)
    return term if tp_group is None else share_over_tp(term, tp_group)
