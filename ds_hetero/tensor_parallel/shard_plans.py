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
from typing import Callable, Iterator

import torch.distributed as dist
from torch import nn

from ..errors import HeteroConfigError
from .family_plans import family_plans
from .layers import ColumnParallelLinear, RowParallelLinear
from .lora import is_lora_layer, shard_lora_column, shard_lora_row
from .regions import EnterRegionHook
from .sequence_parallel import SumGradOverGroup, add_grad_hook


def _config_heads(m: nn.Module) -> tuple[int, int]:
    return m.config.num_attention_heads, m.config.num_key_value_heads


def _attr_heads(m: nn.Module) -> tuple[int, int]:
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


# k_proj and v_proj hold kv_heads * head_dim rows: kv heads divisible by tp keeps GQA groups whole
_QKV_O = dict(column=("q_proj", "k_proj", "v_proj"))
_GATE_UP_DOWN = ShardPlan(column=("gate_proj", "up_proj"), row=("down_proj",))
_FC1_FC2 = ShardPlan(column=("fc1",), row=("fc2",))
_HF = "transformers.models."

PLANS: dict[str, ShardPlan] = {
    # language decoders: q/k/v column (GQA: k and v by kv heads), o row; gate/up column, down row
    _HF + "llama.modeling_llama:LlamaAttention": ShardPlan(row=("o_proj",), heads=_config_heads, **_QKV_O),
    _HF + "llama.modeling_llama:LlamaMLP": _GATE_UP_DOWN,
    _HF + "qwen2.modeling_qwen2:Qwen2Attention": ShardPlan(row=("o_proj",), heads=_config_heads, **_QKV_O),
    _HF + "qwen2.modeling_qwen2:Qwen2MLP": _GATE_UP_DOWN,
    _HF + "qwen2_vl.modeling_qwen2_vl:Qwen2VLAttention": ShardPlan(
        row=("o_proj",), heads=_config_heads, head_attrs=("num_heads", "num_key_value_heads"), **_QKV_O),
    _HF + "qwen2_vl.modeling_qwen2_vl:Qwen2MLP": _GATE_UP_DOWN,
    # vision towers: q/k/v column, out row; fc1 column, fc2 row
    _HF + "clip.modeling_clip:CLIPAttention": ShardPlan(
        column=("q_proj", "k_proj", "v_proj"), row=("out_proj",), heads=_attr_heads, head_attrs=("num_heads",)),
    _HF + "clip.modeling_clip:CLIPMLP": _FC1_FC2,
    _HF + "siglip.modeling_siglip:SiglipAttention": ShardPlan(
        column=("q_proj", "k_proj", "v_proj"), row=("out_proj",), heads=_attr_heads, head_attrs=("num_heads",)),
    _HF + "siglip.modeling_siglip:SiglipMLP": _FC1_FC2,
    # Qwen2-VL vision: fused qkv [3 * heads * head_dim] split per segment, proj row; merger MLP
    _HF + "qwen2_vl.modeling_qwen2_vl:VisionAttention": ShardPlan(
        column=("qkv",), row=("proj",), heads=_attr_heads, head_attrs=("num_heads",), stride=3),
    _HF + "qwen2_vl.modeling_qwen2_vl:VisionMlp": _FC1_FC2,
    _HF + "qwen2_vl.modeling_qwen2_vl:PatchMerger": ShardPlan(column=("mlp.0",), row=("mlp.2",), entry="mlp"),
    # Qwen2.5-Omni thinker: its own classes for the Qwen2 decoder, the windowed vision tower
    # (separate q/k/v; gated MLP; merger) and the audio encoder (Whisper-like: q/k/v column,
    # out row; the layer's own fc1 column, fc2 row)
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniAttention": ShardPlan(
        row=("o_proj",), heads=_config_heads, **_QKV_O),
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2MLP": _GATE_UP_DOWN,
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniVisionAttention": ShardPlan(
        column=("q", "k", "v"), row=("proj",), heads=_attr_heads, head_attrs=("num_heads",)),
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniMLP": _GATE_UP_DOWN,
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniPatchMerger": ShardPlan(
        column=("mlp.0",), row=("mlp.2",), entry="mlp"),
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniAudioAttention": ShardPlan(
        column=("q_proj", "k_proj", "v_proj"), row=("out_proj",), heads=_attr_heads, head_attrs=("num_heads",)),
    _HF + "qwen2_5_omni.modeling_qwen2_5_omni:Qwen2_5OmniAudioEncoderLayer": ShardPlan(
        column=("fc1",), row=("fc2",), entry="fc1"),
    # LLaVA projector: linear_1 column, linear_2 row
    _HF + "llava.modeling_llava:LlavaMultiModalProjector": ShardPlan(column=("linear_1",), row=("linear_2",)),
    **family_plans(ShardPlan, _config_heads, _attr_heads),
}


def _resolve_plans() -> dict[type, ShardPlan]:
    resolved = {}
    for key, plan in PLANS.items():
        module_name, cls_name = key.split(":")
        try:
            resolved[getattr(importlib.import_module(module_name), cls_name)] = plan
        except (ImportError, AttributeError):  # family absent from this transformers version
            continue
    return resolved


def planned_modules(root: nn.Module) -> Iterator[tuple[str, nn.Module, ShardPlan]]:
    plans = _resolve_plans()
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


def validate_tensor_parallel(root: nn.Module, tp: int, stage: str = "stage") -> list[tuple[str, nn.Module, ShardPlan]]:
    """Every planned module of `root` and its plan; HeteroConfigError if tp does not fit one of them."""
    found = list(planned_modules(root))
    if not found:
        raise HeteroConfigError(
            f"hetero_parallel.stages.{stage}", f"no tensor-parallel plan matches any module of {type(root).__name__}; "
            f"supported: {sorted(k.split(':')[1] for k in PLANS)}")
    for name, module, plan in found:
        cls = type(module).__name__
        if plan.heads is not None:
            heads, kv_heads = plan.heads(module)
            _require(heads, "attention heads", tp, cls, name, stage)
            _require(kv_heads, "key/value heads", tp, cls, name, stage)
            continue
        for child in plan.column:
            _require(module.get_submodule(child).out_features, f"width of {child}", tp, cls, name, stage)
        for child in plan.row:
            _require(module.get_submodule(child).in_features, f"width of {child}", tp, cls, name, stage)
    return found


def apply_plans(found, group, sequence_parallel: bool = False, seq_dim: int = 1) -> None:
    """Replace the planned linears by their shards and hook the region entries (no communication)."""
    tp = dist.get_world_size(group)
    for _, module, plan in found:
        for child in plan.column:
            layer = module.get_submodule(child)
            if is_lora_layer(layer):  # a PEFT LoRA layer: base and adapter split together (lora.py)
                shard_lora_column(layer, group, plan.stride)
                continue
            module.set_submodule(child, ColumnParallelLinear.from_linear(layer, group, plan.stride))
        for child in plan.row:
            layer = module.get_submodule(child)
            if is_lora_layer(layer):
                shard_lora_row(layer, group, sequence_parallel, seq_dim)
                continue
            module.set_submodule(child, RowParallelLinear.from_linear(layer, group, sequence_parallel, seq_dim))
        entry = module.get_submodule(plan.entry) if plan.entry else module
        entry.register_forward_pre_hook(EnterRegionHook(group, sequence_parallel, seq_dim), with_kwargs=True)
        for attr in plan.head_attrs:  # the forward reshapes by these: they must be this rank's counts
            setattr(module, attr, getattr(module, attr) // tp)
        for child in plan.per_head:
            for param in module.get_submodule(child).parameters():
                param.tp_partial_grad = True  # sequence parallelism must not sum it again
                add_grad_hook(param, SumGradOverGroup(group))
