"""Activation bytes one rank stores for the backward, per stage and micro-batch (pure).

Language decoder layer (Llama / Qwen2 shape: RMSNorm, GQA attention, SwiGLU MLP, no dropout),
counted tensor by tensor in the way Korthikanti et al. 2022 count a GPT layer, per token, in
elements (times the dtype's bytes):

    replicated over tp (split over tp with sequence parallelism):
        attention norm input h, its output (the q/k/v input) h,
        MLP norm input h, its output (the gate/up input) h                          = 4h
    split over tp (heads, MLP width):
        q (heads x head_dim), k and v (kv_heads x head_dim each; GQA: fewer),
        attention output (the o-projection input) q                                 = 2q + 2kv
        SwiGLU: gate output, up output, silu(gate), silu(gate) x up (down input)    = 4 ffn

with flash attention (the kernel keeps its output and a row's log-sum-exp, recomputing the
scores); without it the softmax output and what the math kernel keeps, 5 bytes per score as in
Korthikanti (2-byte dtype). A GELU MLP of width 4h with full multi-head attention (the old
count, `hidden x (10 + 24 / tp)` with dropout) stores less than SwiGLU at ffn 3.5h and more than
GQA: for a Llama-2-70B layer this count is ~19% above the old one.

A frozen language stage (it still back-propagates to a trained encoder's rows) keeps no input of
its linears, whose weights need no gradient: the two norm outputs, the attention output and the
down projection's input drop out (`language_layer_elements`).

Full activation recompute (per layer, Megatron's "full" granularity) stores only each layer's
input (h per token, / tp with sequence parallelism) and, during the backward, one layer's full
activations at a time.

The vision tower (CLIP / SigLIP / Qwen2-VL blocks: LayerNorm, GELU MLP, full MHA) keeps
Korthikanti's count `hidden x (10 + 24 / tp)` (its dropout masks are off in training too, so
this slightly over-counts). A frozen tower keeps nothing (wl.freeze, frozen.py: autograd records
nothing where neither the input nor a parameter needs a gradient); the projector after it keeps
its input and hidden rows for its weight gradients. An encoder that does not train runs its
forward without autograd: only its output rows are held (until the language stage takes them).
"""

from __future__ import annotations

from ..models.shapes import ModelSpec
from .workload import Workload


def language_layer_elements(spec: ModelSpec, tp: int, sequence_parallel: bool, trains: bool = True) -> float:
    """Elements one decoder layer stores per token of this rank's shard (flash attention).

    `trains` False (a frozen language stage carrying a trained encoder's gradient, frozen.py):
    autograd keeps no input of a linear whose weight needs no gradient (the two norm outputs, the
    attention output, the down projection's input); measured with saved-tensor hooks on the tiny
    LLaVA, a frozen decoder keeps 0.63 of what it keeps training, this count 0.67."""
    lm = spec.language
    q, kv = lm.heads * lm.head_dim, lm.kv_heads * lm.head_dim
    replicated = (4 if trains else 2) * lm.hidden
    if lm.moe:  # attention's, and a shared expert's as a dense MLP's (split over tp)
        split = (2 if trains else 1) * q + 2 * kv + (4 if trains else 3) * lm.shared_ffn
        return (replicated / tp if sequence_parallel else replicated) + split / tp + moe_layer_elements(
            spec, trains) / (tp if sequence_parallel else 1)
    split = (2 if trains else 1) * q + 2 * kv + (4 if trains else 3) * lm.ffn
    return (replicated / tp if sequence_parallel else replicated) + split / tp


def moe_layer_elements(spec: ModelSpec, trains: bool = True) -> float:
    """Elements a MoE block stores per routed token (the experts are replicated over tp: every tp
    rank routes every token of its shard, / tp with sequence parallelism): its router logits and
    probabilities (E each, fp32: 4 elements of a 2-byte dtype), and per (token, expert) assignment
    the expert's input row after the dispatch (h), its SwiGLU (gate, up, silu, product: 4 f, as a
    dense MLP's) and its output before the weighted combine (h). Balanced routing: a rank computes
    as many assignments as it routes."""
    lm = spec.language
    per_assignment = 2 * lm.hidden + (4 if trains else 3) * lm.moe_ffn
    return lm.top_k * per_assignment + 4 * lm.experts


def language_activation_bytes(spec: ModelSpec, wl: Workload, samples: int, tp: int, cp: int,
                              sequence_parallel: bool, flash: bool, layers: int | None = None,
                              recompute: bool = False, head: bool = True, ep: int = 1) -> float:
    """One micro-batch of `samples` sequences on one rank, `layers` decoder layers (default all),
    the fp32 logits and their softmax when this rank holds the head. (`ep` does not change a MoE
    rank's activations under balanced routing: it computes as many assignments as it routes.)"""
    lm = spec.language
    layers = lm.layers if layers is None else layers
    tokens = samples * wl.seq_len / cp
    layer = tokens * language_layer_elements(spec, tp, sequence_parallel, wl.freeze.of("language").trains) \
        * wl.dtype_bytes
    if not flash:  # scores of this rank's heads over the full sequence (Ulysses: heads / cp, all tokens)
        layer += 5 * lm.heads * wl.seq_len * tokens / tp * wl.dtype_bytes / 2
    logits = tokens * lm.vocab / tp * 4 * 2 if head else 0.0
    if recompute:
        kept = tokens * lm.hidden / (tp if sequence_parallel else 1) * wl.dtype_bytes
        return kept * layers + (layer if layers else 0.0) + logits
    return layer * layers + logits


def vision_activation_bytes(spec: ModelSpec, wl: Workload, samples: int, tp: int, flash: bool,
                            recompute: bool = False) -> float:
    """One encoder pass over `samples` samples' images on one rank (tower tokens = encoder tokens)."""
    v = spec.vision
    images = samples * wl.images_per_sample(spec)
    seq = v.seq_per_image(wl.tokens_per_image(spec))
    tokens = images * seq
    layer = (tokens * v.hidden * (10 + 24 / tp) + (0 if flash else 5 * v.heads * seq * tokens / tp)) \
        * wl.dtype_bytes / 2
    rows = images * wl.tokens_per_image(spec) * spec.language.hidden * wl.dtype_bytes  # the projector's output
    f = wl.freeze.of("vision")
    if not f.trains:
        return rows
    if f.tower:  # the projector's input (the tower's features) and hidden rows, for its weight gradients
        (i1, o1), *rest = v.projector
        per_row = i1 + (2 * o1 / tp if rest else 0)  # linear_1's input; GELU's input and output
        return images * wl.tokens_per_image(spec) * per_row * v.boundary_levels * wl.dtype_bytes + rows
    if recompute:
        return tokens * v.hidden * wl.dtype_bytes * v.layers_backward + layer + rows
    return layer * v.layers_backward + rows
