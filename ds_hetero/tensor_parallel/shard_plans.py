"""Which Hugging Face modules are sharded how: a table of plans, checked before anything changes.

A plan describes one module class as a self-contained tp region: the children whose output
features are split (column), the children whose input features are split and whose output
is reduced (row), where the region is entered, and for attention how many heads and key/value
heads the column shards must divide. Plans are keyed by the class itself (resolved lazily from
"module:Class"), so a same-named class of another family never matches by accident.

`validate_tensor_parallel` depends only on the module tree and tp: every rank raises the
same `HeteroConfigError` before any collective. `apply_plans` then shards without any
communication (every rank slices its part of identical full weights).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import torch.distributed as dist
from torch import nn

from ..errors import HeteroConfigError
from .channels import is_depthwise, shard_depthwise_conv, shard_head_vector
from .layers import ColumnParallelLinear, RowParallelLinear
from .lora import is_lora_layer, shard_lora_column, shard_lora_row
from .regions import EnterRegionHook
from .sequence_parallel import SumGradOverGroup, add_grad_hook


def config_heads(m: nn.Module) -> tuple[int, int]:
    return m.config.num_attention_heads, m.config.num_key_value_heads


def attr_heads(m: nn.Module) -> tuple[int, int]:
    return m.num_heads, m.num_heads


@dataclass(frozen=True)
class ShardPlan:
    column: tuple[str, ...]
    row: tuple[str, ...]
    entry: str = ""  # child whose input enters the region; "" = the module itself
    heads: Callable[[nn.Module], tuple[int, int]] | None = None  # (heads, kv heads) for attention
    head_attrs: tuple[str, ...] = ()  # attributes the forward reads as head counts -> made local
    stride: int = 1  # fused segments per column weight (3 for a fused qkv)
    # children applied to every head after a column split (Gemma 3 / Qwen3 q_norm, k_norm): their
    # replicated weights see only this rank's heads, so their gradients are summed over tp
    per_head: tuple[str, ...] = ()
    head_names: tuple[str, str] = ("attention heads", "key/value heads")  # what `heads` counts, for errors
    # column-split children whose output is several fused segments of unequal widths, and depthwise
    # convolutions over those same channels (Qwen3.5's Gated DeltaNet: in_proj_qkv, then conv1d over
    # q | k | v): each split segment by segment, the widths from `segments(module)` (channels.py)
    fused: tuple[str, ...] = ()
    segments: Callable[[nn.Module], tuple[int, ...]] | None = None
    # the module's own per-head parameters (one entry per head on dim 0), split with the heads
    vectors: tuple[str, ...] = ()
    # children of `column` / `row` / `per_head` some instances of the class do not have (Gemma 4's
    # kv-shared layers have no k_proj, v_proj or k_norm; its k-as-v layers no v_proj): skipped there
    optional: tuple[str, ...] = ()


# The plans themselves are data of the model families (ds_hetero/families/<family>/plans.py, merged
# by the family registry's `tp_plans()`): every function here takes the table it applies.
PlanTable = Mapping[str, ShardPlan]


def _resolve_plans(plans: PlanTable) -> dict[type, ShardPlan]:
    resolved = {}
    for key, plan in plans.items():
        module_name, cls_name = key.split(":")
        try:
            resolved[getattr(importlib.import_module(module_name), cls_name)] = plan
        except (ImportError, AttributeError):  # family absent from this transformers version
            continue
    return resolved


def planned_modules(root: nn.Module, plans: PlanTable) -> Iterator[tuple[str, nn.Module, ShardPlan]]:
    """Every module of `root` whose class has a plan in `plans`, with that plan."""
    plans = _resolve_plans(plans)
    for name, module in root.named_modules():
        plan = plans.get(type(module))
        if plan is not None:
            yield name, module, plan


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _require(count: int, what: str, tp: int, cls: str, name: str, stage: str) -> None:
    if count % tp:
        raise HeteroConfigError(
            f"hetero_parallel.stages.{stage}.tp",
            f"tp={tp} does not divide the {what} ({count}) of {cls} at '{name or '<root>'}'; "
            f"tp sizes that would: {_divisors(count)}",
        )


def validate_tensor_parallel(root: nn.Module, tp: int, stage: str = "stage", *,
                             plans: PlanTable) -> list[tuple[str, nn.Module, ShardPlan]]:
    """Every planned module of `root` and its plan; HeteroConfigError if tp does not fit one of them."""
    found = list(planned_modules(root, plans))
    if not found:
        raise HeteroConfigError(
            f"hetero_parallel.stages.{stage}", f"no tensor-parallel plan matches any module of {type(root).__name__}; "
            f"supported: {sorted(k.split(':')[1] for k in plans)}")
    for name, module, plan in found:
        cls = type(module).__name__
        if plan.heads is not None:
            heads, kv_heads = plan.heads(module)
            _require(heads, plan.head_names[0], tp, cls, name, stage)
            _require(kv_heads, plan.head_names[1], tp, cls, name, stage)
            continue
        for child in (c for c in plan.column if c not in plan.optional or child_of(module, c) is not None):
            _require(module.get_submodule(child).out_features, f"width of {child}", tp, cls, name, stage)
        for child in (c for c in plan.row if c not in plan.optional or child_of(module, c) is not None):
            _require(module.get_submodule(child).in_features, f"width of {child}", tp, cls, name, stage)
    return found


def apply_plans(found, group, sequence_parallel: bool = False, seq_dim: int = 1) -> None:
    """Replace the planned linears by their shards and hook the region entries (no communication)."""
    tp = dist.get_world_size(group)
    for _, module, plan in found:
        present = lambda child, m=module, p=plan: child not in p.optional or child_of(m, child) is not None  # noqa: E731
        for child in filter(present, plan.column):
            _shard_column(module, child, group, plan.stride)
        fused = plan.segments(module) if plan.fused else 1  # read before head_attrs become local
        for child in plan.fused:
            _shard_column(module, child, group, tuple(fused))
        for name in plan.vectors:
            shard_head_vector(module, name, group)
        for child in filter(present, plan.row):
            layer = module.get_submodule(child)
            if is_lora_layer(layer):
                shard_lora_row(layer, group, sequence_parallel, seq_dim)
                continue
            module.set_submodule(child, RowParallelLinear.from_linear(layer, group, sequence_parallel, seq_dim))
        entry = module.get_submodule(plan.entry) if plan.entry else module
        entry.register_forward_pre_hook(EnterRegionHook(group, sequence_parallel, seq_dim), with_kwargs=True)
        for attr in plan.head_attrs:  # the forward reshapes by these: they must be this rank's counts
            setattr(module, attr, getattr(module, attr) // tp)
        for child in filter(present, plan.per_head):
            target = child_of(module, child)  # a child module, or a parameter of the module itself
            for param in [target] if isinstance(target, nn.Parameter) else target.parameters():
                param.tp_partial_grad = True  # sequence parallelism must not sum it again
                if param.requires_grad:  # frozen (a LoRA base model's q_norm): no gradient to sum
                    add_grad_hook(param, SumGradOverGroup(group))


def child_of(module: nn.Module, name: str):
    """The submodule or parameter `name` of `module` (dotted), or None where it is absent or None."""
    try:
        return module.get_submodule(name)
    except AttributeError:
        parent, _, attr = name.rpartition(".")
        target = getattr(module.get_submodule(parent) if parent else module, attr, None)
        return target if isinstance(target, nn.Parameter) else None


def _shard_column(module: nn.Module, child: str, group, stride) -> None:
    layer = module.get_submodule(child)
    if is_lora_layer(layer):  # a PEFT LoRA layer: base and adapter split together (lora.py)
        shard_lora_column(layer, group, stride)
    elif is_depthwise(layer):
        module.set_submodule(child, shard_depthwise_conv(layer, group, stride))
    else:
        module.set_submodule(child, ColumnParallelLinear.from_linear(layer, group, stride))
