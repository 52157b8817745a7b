"""Gated DeltaNet layers on sequence shards (language cp > 1): the heads split over cp, as Ulysses does.

Under cp each rank holds a contiguous chunk of every sequence, and a Gated DeltaNet layer's output at
a position depends on its short causal convolution's window and on the delta rule's recurrent state,
both carried from every earlier position. Rather than hand that state (and the convolution's tail)
from cp rank to cp rank in sequence order, which serializes the cp ranks, each rank takes whole
sequences for a share of the heads, as the full-attention layers do (context_parallel/attention.py):

    in_proj_qkv, in_proj_b, in_proj_a on the rank's chunk     [b, S/cp, (q | k | v | b | a) of its tp heads]
      --all-to-all over cp-->                                 [b, S, the same for value heads / cp]
    depthwise conv + chunked delta rule over whole sequences  (every head alone: no state crosses ranks)
      --all-to-all over cp-->                                 [b, S/cp, value heads of its tp share]
    gated norm (with in_proj_z of the chunk, never sent), out_proj (the tp reduction)

Exact: every operation between the in-projections and the norm is per value head (the convolution is
depthwise, the L2 norms of q and k per head, the recurrence per value head), and everything else is per
token. Each key head serves `num_v_heads / num_k_heads` consecutive value heads; cp rank c takes value
heads [c V, (c + 1) V) of the rank's tp share (V = value heads / (tp cp)) with the key heads they read.
When cp does not divide the tp share's key heads (2 key heads at tp 2 cp 2) the key heads' q and k are
repeated `lcm(key heads, cp) / key heads` times first, each copy beside its original (what the delta
rule itself does before its recurrence: `repeat_interleave`), and so is their convolution kernel; so
the only condition is that tp x cp divides the value heads (`check_heads`, by name).

Gradients: the in-projections, A_log, dt_bias, the conv kernel and the norm are replicated over cp;
each rank's gradient is its chunk's (in-projections, norm) or its heads' (the conv channels and the
per-head vectors it sliced), and DeepSpeed sums them over cp (context_parallel/ says how), as for
every parameter on sequence shards.

Packed rows: after the exchange a rank holds whole rows, so the row's samples restart exactly as
packed_deltanet.py restarts them: every segment of `packed_segments` one row of a right-padded
batch, the convolution and the recurrence run once on it, each from a zero state.

Cost per layer and micro-batch, per rank, forward (the backward the same again, the adjoint exchange):
sent (cp - 1) / cp of b S/cp x (2 rho key_dim + value_dim + 2 num_v_heads) / tp elements out and
b S/cp x value_dim / tp back (rho the repeat above, usually 1), two all-to-alls with no ordering
between cp ranks: nothing serializes. A hand-off of the state instead would send only the state
(num_v_heads x k_dim x v_dim per sequence, and the conv tail) but run the cp ranks one after another.

The forward below is the Hugging Face layer's, cut where the exchanges go: its own parameters, its own
model file's `causal_conv1d_fn` and `torch_chunk_gated_delta_rule` (the flash-linear-attention and
causal-conv1d kernels where transformers resolved them), its own gated norm; at cp 1 it is the stock
forward (tested bit for bit).
"""

from __future__ import annotations

import math
import sys
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...comm import all_to_all
from ...errors import HeteroConfigError
from .packed_deltanet import check_segments, install_forward, runs_forward, segments_as_batch


def check_heads(text_config, tp: int, cp: int, stage: str = "language") -> None:
    """tp x cp must divide the linear-attention value heads (pure: the same error on every rank)."""
    heads = text_config.linear_num_value_heads
    if cp > 1 and heads % (tp * cp):
        fits = [c for c in range(1, heads + 1) if heads % (tp * c) == 0]
        raise HeteroConfigError(
            f"hetero_parallel.stages.{stage}.cp",
            f"Qwen3.5's Gated DeltaNet layers run on sequence shards by splitting their {heads} linear-attention "
            f"value heads over tp*cp = {tp}*{cp} = {tp * cp} ranks (each with the key heads it reads), which does "
            f"not divide them; cp sizes that would with tp={tp}: {fits}")


def key_repeat(key_heads: int, cp: int) -> int:
    """How many copies of each key head (of a tp share) make cp divide them (module docstring)."""
    return math.lcm(key_heads, cp) // key_heads


def sequence_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """[b, s, cp, w] (block c of the channels for cp rank c) -> [b, cp s, w] (the whole sequence, in
    cp-rank order, of this rank's block). Its backward is `heads_to_sequence` (comm.all_to_all's
    backward is the inverse exchange)."""
    b, s, cp, w = x.shape
    if cp == 1:  # no cp group: the chunk is the sequence
        return x.reshape(b, s, w)
    rows = x.permute(2, 0, 1, 3).reshape(cp * b, s, w)  # block c's rows first for rank c
    got = all_to_all(rows, [b] * cp, [b] * cp, group)  # rank c's chunk of the sequence, c in order
    return got.reshape(cp, b, s, w).transpose(0, 1).reshape(b, cp * s, w)


def heads_to_sequence(y: torch.Tensor, group) -> torch.Tensor:
    """[b, S, w] (this rank's block, whole sequences) -> [b, S/cp, cp, w] (this rank's chunk of the
    sequence, every rank's block in cp-rank order): the inverse of `sequence_to_heads`."""
    cp = 1 if group is None else dist.get_world_size(group)
    b, length, w = y.shape
    if cp == 1:
        return y.reshape(b, length, 1, w)
    rows = y.reshape(b, cp, length // cp, w).transpose(0, 1).reshape(cp * b, length // cp, w)
    got = all_to_all(rows, [b] * cp, [b] * cp, group)  # block c of this rank's chunk, c in order
    return got.reshape(cp, b, length // cp, w).permute(1, 2, 0, 3)


def _blocks(t: torch.Tensor, heads: int, repeat: int, cp: int) -> torch.Tensor:
    """[..., heads * d] -> [..., cp, heads * repeat / cp * d]: each head repeated `repeat` times beside
    itself, then cut into cp contiguous blocks of heads (block c for cp rank c)."""
    t = t.unflatten(-1, (heads, -1))
    if repeat > 1:
        t = t.repeat_interleave(repeat, dim=-2)
    return t.unflatten(-2, (cp, -1)).flatten(-2)


def _own_heads(t: torch.Tensor, heads: int, repeat: int, cp: int, rank: int) -> torch.Tensor:
    """This cp rank's block (dim 0) of a per-head tensor [heads * d, ...] (a conv kernel, a vector)."""
    t = t.unflatten(0, (heads, -1))
    if repeat > 1:
        t = t.repeat_interleave(repeat, dim=0)
    return t.unflatten(0, (cp, -1))[rank].flatten(0, 1)


def _mix(module: nn.Module, funcs, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, kernel: torch.Tensor,
         bias: torch.Tensor | None, A_log: torch.Tensor, dt_bias: torch.Tensor, widths: tuple[int, int]) -> torch.Tensor:
    """The layer's convolution and delta rule over whole sequences of this rank's heads: qkv [n, L, q|k|v],
    b and a [n, L, V] -> [n, L, V, head_v_dim] (the stock forward's steps, from its own functions)."""
    n, length, _ = qkv.shape
    mixed = funcs.causal_conv1d_fn(qkv.transpose(1, 2), kernel, bias, activation=module.activation).transpose(1, 2)
    query, key, value = torch.split(mixed, [widths[0], widths[0], widths[1]], dim=-1)
    query = query.reshape(n, length, -1, module.head_k_dim)
    key = key.reshape(n, length, -1, module.head_k_dim)
    value = value.reshape(n, length, -1, module.head_v_dim)
    beta = b.sigmoid()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)  # the stock forward's decay, in float32
    out, _ = funcs.torch_chunk_gated_delta_rule(query, key, value, g=g, beta=beta, initial_state=None,
                                                output_final_state=False, use_qk_l2norm_in_kernel=True)
    return out


def sharded_forward(module: nn.Module, hidden_states: torch.Tensor, cache_params=None,
                    attention_mask: torch.Tensor | None = None, cp_group=None,
                    packed_segments: Sequence[Sequence[int]] | None = None, **kwargs) -> torch.Tensor:
    """The Gated DeltaNet layer on this rank's sequence chunk `hidden_states` [b, S/cp, H] (module
    docstring); `packed_segments`: packed rows' segment lengths (whole rows), each restarted.
    `cp_group` None: one rank holds the whole sequence (cp 1: the stock forward, bit for bit)."""
    if cache_params is not None:
        raise ValueError("a Gated DeltaNet layer on sequence shards keeps no cache (training only)")
    if attention_mask is not None:  # a 2-D padding mask of the chunk: zero the padding, as the stock forward
        hidden_states = (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)
    cp, rank = (1, 0) if cp_group is None else (dist.get_world_size(cp_group), dist.get_rank(cp_group))
    funcs = sys.modules[type(module).__module__]  # the model file's own kernels (or their torch paths)
    batch, chunk, _ = hidden_states.shape
    nk, nv = module.num_k_heads, module.num_v_heads  # this tp rank's
    repeat = key_repeat(nk, cp)
    q, k, v = module.in_proj_qkv(hidden_states).split([module.key_dim, module.key_dim, module.value_dim], dim=-1)
    sent = torch.cat([_blocks(q, nk, repeat, cp), _blocks(k, nk, repeat, cp), _blocks(v, nv, 1, cp),
                      _blocks(module.in_proj_b(hidden_states), nv, 1, cp),
                      _blocks(module.in_proj_a(hidden_states), nv, 1, cp)], dim=-1)
    whole = sequence_to_heads(sent, cp_group)  # [b, S, this rank's heads]
    key_width, value_width, heads = module.key_dim * repeat // cp, module.value_dim // cp, nv // cp
    kernel = module.conv1d.weight.squeeze(1)
    own = lambda t: torch.cat([_own_heads(t[:module.key_dim], nk, repeat, cp, rank),  # noqa: E731
                               _own_heads(t[module.key_dim:2 * module.key_dim], nk, repeat, cp, rank),
                               _own_heads(t[2 * module.key_dim:], nv, 1, cp, rank)])
    bias = None if module.conv1d.bias is None else own(module.conv1d.bias)
    vectors = [_own_heads(p, nv, 1, cp, rank) for p in (module.A_log, module.dt_bias)]
    conv_width = 2 * key_width + value_width

    def run(x: torch.Tensor) -> torch.Tensor:
        qkv, b, a = x.split([conv_width, heads, heads], dim=-1)
        return _mix(module, funcs, qkv, b, a, own(kernel), bias, *vectors, (key_width, value_width))

    if packed_segments is None:
        core = run(whole)
    else:  # whole rows here: each sample one row of a right-padded batch, from a zero state
        check_segments(packed_segments, batch, whole.shape[1])
        rows, mask = segments_as_batch(whole, packed_segments)
        core = run(rows)[mask.bool()].reshape(batch, whole.shape[1], heads, module.head_v_dim)
    back = heads_to_sequence(core.flatten(-2), cp_group)  # [b, S/cp, cp, V * head_v_dim]
    core = back.reshape(-1, module.head_v_dim)  # value heads in order: cp block c holds heads [c V, (c+1) V)
    z = module.in_proj_z(hidden_states).reshape(-1, module.head_v_dim)
    return module.out_proj(module.norm(core, z).reshape(batch, chunk, -1))


def apply_sequence_sharded_deltanet(decoder: nn.Module, cp_group) -> int:
    """Give every Gated DeltaNet module of `decoder` the forward on sequence shards over `cp_group` (in
    place, per instance, replacing a packed forward: this one restarts packed samples itself); how many."""
    return install_forward(decoder, sharded_forward, cp_group=cp_group)


def on_sequence_shards(module: nn.Module) -> bool:
    """Whether `module` is a Gated DeltaNet layer running `sharded_forward`."""
    return runs_forward(module, sharded_forward)


__all__ = ["apply_sequence_sharded_deltanet", "check_heads", "heads_to_sequence", "key_repeat",
           "on_sequence_shards", "sequence_to_heads", "sharded_forward"]
