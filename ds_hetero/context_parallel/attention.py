"""Attention over a sequence-sharded language decoder: Ulysses all-to-all over the stage's cp group.

Between attention calls each cp rank holds a contiguous chunk of every sequence (`boundary.inputs`
convention). Attention needs every key, so around the attention kernel one all-to-all trades
the sequence shard for a head shard:

    q, k, v   [b, S/cp, h, d]  --all-to-all-->  [b, S, h/cp, d]   attention over the full sequence
    output    [b, S, h/cp, d]  --all-to-all-->  [b, S/cp, h, d]   (its backward: the inverse exchanges)

Which library does it: DeepSpeed's `deepspeed.sequence.layer.DistributedAttention`, which takes
the process group explicitly (`sequence_process_group`) and keeps its head count per instance.
Not used: DeepSpeed's Hugging Face Ulysses registration (`deepspeed.runtime.sequence_parallel.
ulysses_sp.UlyssesSPAttentionHF`): it is built from a world-wide mpu (`parallel_state_sp`) and
registers itself under one process-global attention name, so two stages (or two models) in one
process could not each have their own group.

How it is hooked into Hugging Face: transformers 5 attention modules look their kernel up by
`config._attn_implementation` in the process-wide `ALL_ATTENTION_FUNCTIONS` registry; there is no
per-module hook between the q/k/v projections (+ RoPE) and the kernel. So: ONE stateless entry
(`ATTENTION_NAME`) is registered, whose function only forwards to the calling module's own
`SequenceShardedAttention` (holding that module's group and inner kernel); each wrapped attention
module gets its own shallow copy of the config naming that entry. Modules not wrapped, other
models and the decoder's mask code keep their configuration.

Masks: the decoder sees only its shard, so its own causal/padding mask would be the shard's. The
language stage therefore passes the full sequence's mask as a 4-D boolean tensor [b, 1, S, S]
(`sequence.full_attention_mask`); Hugging Face hands a 4-D mask through unchanged, and the wrapper
gives it to the inner kernel (as an additive mask for eager). Positions are the global ones
(the stage passes `position_ids` sliced from the full sequence), so RoPE, applied before the
kernel on the local chunk, is exact.

GQA: the all-to-all splits q heads and kv heads into cp contiguous chunks, which keeps every
query head with its kv head when cp divides the local kv heads. When it does not (e.g. 2 kv
heads, tp 2, cp 2), the kv heads are first repeated r = lcm(kv, cp) / kv times (each copy stays
next to its original, so chunk c of the q heads still meets the kv heads it uses); the inner
kernel then sees `num_key_value_groups / r`. This costs r times the kv all-to-all bytes.
"""

from __future__ import annotations

import math
import sys
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ..errors import HeteroConfigError

ATTENTION_NAME = "ds_hetero_sequence_shards"

# Attention classes of the language decoders this supports (Llama, Qwen2, Qwen2-VL, Qwen2.5-VL, Qwen3-VL text,
# Qwen3-VL-MoE text, Qwen3.5, Qwen3.5-MoE).
_HF = "transformers.models."
ATTENTION_CLASSES = (
    _HF + "llama.modeling_llama:LlamaAttention",
    _HF + "qwen2.modeling_qwen2:Qwen2Attention",
    _HF + "qwen2_vl.modeling_qwen2_vl:Qwen2VLAttention",
    _HF + "qwen2_5_vl.modeling_qwen2_5_vl:Qwen2_5_VLAttention",
    _HF + "qwen3_vl.modeling_qwen3_vl:Qwen3VLTextAttention",
    _HF + "qwen3_vl_moe.modeling_qwen3_vl_moe:Qwen3VLMoeTextAttention",  # as Qwen3-VL text
    # Qwen3.5's gated full attention: its output gate multiplies the kernel's output per token of the
    # shard, after the exchange back (its Gated DeltaNet layers: families/qwen3_5/sequence_shards.py)
    _HF + "qwen3_5.modeling_qwen3_5:Qwen3_5Attention",
    _HF + "qwen3_5_moe.modeling_qwen3_5_moe:Qwen3_5MoeAttention",
)


def _attention_classes() -> tuple[type, ...]:
    import importlib

    found = []
    for key in ATTENTION_CLASSES:
        module_name, cls_name = key.split(":")
        try:
            found.append(getattr(importlib.import_module(module_name), cls_name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    """The registered entry: stateless, forwards to the module's own wrapper."""
    return module.ds_hetero_sequence_attention(module, query, key, value, attention_mask, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if ATTENTION_NAME not in ALL_ATTENTION_FUNCTIONS:  # idempotent: the function holds no state
        AttentionInterface.register(ATTENTION_NAME, _dispatch)


def _inner_kernel(module: nn.Module, name: str) -> Callable:
    """The kernel the module would have used (`eager` is each model file's own function)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager if name in (None, "eager") else ALL_ATTENTION_FUNCTIONS.get_interface(name, eager)


class _GroupsView:
    """The attention module as the inner kernel sees it, with another `num_key_value_groups`."""

    def __init__(self, module: nn.Module, groups: int):
        self._module, self.num_key_value_groups = module, groups

    def __getattr__(self, name):
        return getattr(self._module, name)


class SequenceShardedAttention:
    """Per-module attention over sequence shards: Ulysses over `cp_group`, full-sequence mask.

    Held as a plain attribute (not a child module), so the module tree, parameter names and
    state dict stay Hugging Face's.
    """

    def __init__(self, module: nn.Module, cp_group, inner: str | None):
        import deepspeed
        from deepspeed.sequence.layer import DistributedAttention

        from ..patches import skip_cpu_shm_comm_build

        if not deepspeed.comm.is_initialized():  # its collectives go through deepspeed.comm
            skip_cpu_shm_comm_build()
            deepspeed.init_distributed(dist_backend=dist.get_backend())
        self.cp_group, self.cp = cp_group, dist.get_world_size(cp_group)
        self.inner_name = inner
        self.inner = _inner_kernel(module, inner)
        self.eager = self.inner is sys.modules[type(module).__module__].eager_attention_forward
        # [b, s, h, d] layout: scatter heads (dim 2), gather the sequence (dim 1)
        self.ulysses = DistributedAttention(self._local, cp_group, scatter_idx=2, gather_idx=1) if self.cp > 1 else None

    def _local(self, q, k, v, module, attention_mask, **kwargs):
        # [b, S, h/cp, d] -> the [b, h/cp, S, d] Hugging Face kernels take; they return [b, S, h/cp, d]
        out, _ = self.inner(module, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attention_mask,
                            **kwargs)
        return out

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        if attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[-1] != attention_mask.shape[-2]:
            raise ValueError(
                "attention over sequence shards needs the full sequence's 4-D mask [b, 1, S, S] "
                "(ds_hetero.context_parallel.full_attention_mask); the decoder was called without it")
        mask = attention_mask
        if self.eager and mask.dtype == torch.bool:  # eager adds its mask to the scores
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill_(
                ~mask, torch.finfo(query.dtype).min)
        kwargs.pop("is_causal", None)  # the mask says it all
        if self.ulysses is None:  # sequence parallelism alone: the tp region already gathered the sequence
            out, _ = self.inner(module, query, key, value, mask, **kwargs)
            return out, None
        kv = key.shape[1]
        repeat = math.lcm(kv, self.cp) // kv
        if repeat > 1:  # GQA with fewer local kv heads than cp ranks (module docstring)
            key = key.repeat_interleave(repeat, dim=1)
            value = value.repeat_interleave(repeat, dim=1)
        view = module if repeat == 1 else _GroupsView(module, module.num_key_value_groups // repeat)
        # [b, h, S/cp, d] -> [b, S/cp, h, d]: DeepSpeed's batch-first layout
        out = self.ulysses(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), 0, None,
                           view, mask, **kwargs)
        return out, None


def check_context_parallel(config, tp: int, cp: int, sharded: bool = True, stage: str = "language") -> None:
    """Heads divisible by tp*cp, no sliding-window layers on sequence shards (pure; the same
    HeteroConfigError on every rank). `sharded`: the stage cuts its sequences (cp or sp)."""
    if sharded and getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise HeteroConfigError(
            f"hetero_parallel.stages.{stage}",
            "sequence shards (cp > 1 or sequence_parallel) need full causal attention; this decoder has "
            f"sliding-window layers (sliding_window={config.sliding_window}), whose mask is not built here")
    kernel = getattr(config, "_attn_implementation", None)
    if sharded and kernel not in (None, "eager", "sdpa", ATTENTION_NAME):
        raise HeteroConfigError(
            f"hetero_parallel.stages.{stage}",
            f"sequence shards pass the full sequence's mask as a dense [b, 1, S, S] tensor, which the "
            f"attention implementation {kernel!r} does not take; load the model with attn_implementation="
            "\"sdpa\" or \"eager\"")
    if cp == 1:
        return
    heads = config.num_attention_heads
    if heads % (tp * cp):
        fits = [c for c in range(1, heads + 1) if heads % (tp * c) == 0]
        raise HeteroConfigError(
            f"hetero_parallel.stages.{stage}.cp",
            f"Ulysses context parallelism splits the {heads} attention heads over tp*cp = {tp}*{cp} = {tp * cp} "
            f"ranks, which does not divide them; cp sizes that would with tp={tp}: {fits}")


def apply_sequence_sharded_attention(decoder: nn.Module, cp_group) -> int:
    """Route every supported attention module of `decoder` through a SequenceShardedAttention.

    Returns how many modules were wrapped (a decoder with none raises: nothing would be exact).
    """
    _register()
    classes = _attention_classes()
    wrapped = 0
    for module in decoder.modules():
        if not isinstance(module, classes):
            continue
        inner = module.config._attn_implementation
        if inner == ATTENTION_NAME:  # already wrapped
            wrapped += 1
            continue
        import copy

        module.config = copy.copy(module.config)  # this module's own: the decoder's config is untouched
        module.config._attn_implementation_internal = ATTENTION_NAME
        module.ds_hetero_sequence_attention = SequenceShardedAttention(module, cp_group, inner)
        wrapped += 1
    if not wrapped:
        raise HeteroConfigError(
            "hetero_parallel.stages.language.cp",
            f"no supported attention module in {type(decoder).__name__} (supported: "
            f"{[k.split(':')[1] for k in ATTENTION_CLASSES]})")
    return wrapped
