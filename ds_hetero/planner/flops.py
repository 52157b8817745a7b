"""The matrix multiplications of one stage on one rank for one micro-batch, from the model's shapes.

Each `Gemm(m, k, n, count)` is `count` products of [m, k] x [k, n] (2mkn FLOPs each). A forward
GEMM costs two of the same size in the backward (input and weight gradients), except where no
input gradient is needed (the patch embedding of pixels). Attention is two batched GEMMs per
head (scores q k^T, then probabilities x v):

    vision    full attention within each image (CLIP/SigLIP in LLaVA and Gemma 3, Qwen2-VL), or
              within windows in Qwen2.5-VL's windowed blocks; tower tokens = image tokens x
              merge (+ CLS), merge being Qwen's spatial merge^2 or Gemma 3's pooling kernel^2
    language  causal attention over the whole sequence: `causal` is the share of the score
              matrix a kernel computes (0.5 for flash-style kernels that skip the masked half,
              1.0 for a kernel that computes the full matrix and masks it, as SDPA on CPU)

Tensor parallelism divides heads and MLP width by tp (Megatron's column/row split); context
parallelism (Ulysses) divides the tokens of every linear by cp and the heads of attention by
cp, each rank then attending over the full sequence. Element-wise work (norms, activations,
residuals) is counted separately as bytes moved (`elementwise_bytes`; the softmax over the scores
apart, `score_bytes`, and the two attention products marked `kept`: a flash attention kernel keeps
the scores on chip, so on a machine with flash attention they move no memory), and every
operator call costs a fixed overhead (kernel launch on a GPU, dispatch on a CPU): the counts
below are the top-level aten ops of one Hugging Face layer's forward, counted with
torch.profiler on the tiny models (CLIP layer 23 + 11 for embeddings and head of the tower,
Llama layer 63 + 23; rotary embeddings and masks make the decoder layer long).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.shapes import ModelSpec
from .workload import Workload


@dataclass(frozen=True)
class Gemm:
    m: int
    k: int
    n: int
    count: int = 1
    backward: int = 2  # GEMMs of the same size in the backward (1: weight gradient only)
    forward: int = 1  # in the forward (0: a product only the backward computes, a triangular solve's gradient)
    # the operand a fused (flash) attention kernel keeps on chip: "output" for the scores q k^T, "left" for
    # the probabilities of p v; it costs no memory traffic there (machine.gemm_time), nor changes the FLOPs
    kept: str = ""

    @property
    def flops(self) -> int:
        """FLOPs of one pass of the `count` products."""
        return 2 * self.m * self.k * self.n * self.count


@dataclass(frozen=True)
class StageWork:
    """One stage's work per micro-batch on one rank: forward GEMMs, element-wise bytes, op count."""

    gemms: tuple[Gemm, ...]
    elementwise_bytes: float  # forward; the backward moves about twice as much
    layers_forward: int
    layers_backward: int
    tokens: int  # tokens this rank's linears see per micro-batch
    ops: int = 0  # operator calls of the forward (each costs the machine's op_overhead; the backward twice)
    backward_share: float = 1.0  # share of the element-wise bytes and op calls the backward revisits
    #                              (a frozen tower's are not: autograd recorded nothing there, frozen.py)
    score_bytes: float = 0.0  # forward: the softmax's passes over the [s, s] scores, which a flash attention
    #                           kernel keeps on chip (cost.py adds them only where the machine has no flash)

    @property
    def forward_flops(self) -> int:
        return sum(g.flops * g.forward for g in self.gemms)

    @property
    def backward_flops(self) -> int:
        return sum(g.flops * g.backward for g in self.gemms)

    @property
    def flops(self) -> int:
        """Forward + backward FLOPs (the training FLOPs of this micro-batch on this rank)."""
        return self.forward_flops + self.backward_flops


VISION_OPS_PER_LAYER, VISION_OPS_FIXED = 23, 11 + 6  # + projector
LANGUAGE_OPS_PER_LAYER, LANGUAGE_OPS_FIXED = 63, 23 + 8  # + head and loss


def vision_work(spec: ModelSpec, wl: Workload, samples: int, tp: int) -> StageWork:
    """The vision stage on one rank: `samples` samples' images, tower and projector split over tp.

    Frozen parts (wl.freeze, frozen.py): no backward through a frozen tower (its input, the pixels,
    needs no gradient: autograd records nothing), the projector's first linear then computes its
    weight gradient only; a frozen projector its input gradients only; a stage that does not
    train runs its forward alone."""
    v = spec.vision
    f = wl.freeze.of("vision")
    tower_bwd = f.backward_through_tower  # GEMMs of the tower's backward: 0 when frozen
    images = samples * wl.images_per_sample(spec)
    k = wl.tokens_per_image(spec)
    seq = v.seq_per_image(k)
    tower = images * seq
    rows = images * k
    heads = v.heads // tp
    hd = v.hidden // v.heads
    mlp = 3 if v.gated_mlp else 2  # gate, up, down (Qwen2.5-VL) or fc1, fc2
    layer = (
        Gemm(tower, v.hidden, 3 * v.hidden // tp),  # q, k, v (column)
        Gemm(tower, v.hidden // tp, v.hidden),  # out (row)
        Gemm(tower, v.hidden, (mlp - 1) * v.ffn // tp),  # fc1 or gate + up (column)
        Gemm(tower, v.ffn // tp, v.hidden),  # fc2 or down (row)
    )
    # the forward runs layers_forward layers; the gradient reaches layers_backward of them
    used, unused = v.layers_backward, v.layers_forward - v.layers_backward
    gemms = [Gemm(images * seq - images * v.cls_tokens, v.patch_in, v.hidden, 1, backward=int(tower_bwd))]  # patch embedding
    if v.stem_in:  # a second embedding layer (an audio encoder's strided convolution)
        gemms.append(Gemm(tower, v.stem_in, v.hidden, backward=2 * tower_bwd))
    gemms += [Gemm(g.m, g.k, g.n, g.count * used, backward=2 * tower_bwd) for g in layer]
    gemms += [Gemm(g.m, g.k, g.n, g.count * unused, backward=0) for g in layer if unused]
    # attention within each image, or within windows of it (Qwen2.5-VL: most blocks windowed)
    score_elems = 0
    for n_layers, span in v.attention_spans(seq):
        calls = images * heads * -(-seq // span)  # windows per image (the last one may be partial)
        grad = min(n_layers, used) if n_layers == v.layers_forward else n_layers
        gemms += [Gemm(span, hd, span, calls * grad, 2 * tower_bwd, kept="output"),
                  Gemm(span, span, hd, calls * grad, 2 * tower_bwd, kept="left")]  # scores, p x v
        if n_layers > grad:
            gemms += [Gemm(span, hd, span, calls * (n_layers - grad), backward=0, kept="output"),
                      Gemm(span, span, hd, calls * (n_layers - grad), backward=0, kept="left")]
        score_elems += calls * span * span * n_layers
    # the projector's backward: weight gradients unless frozen, input gradients unless nothing before
    # them needs one (the first linear after a frozen tower; both linears when the stage does not train)
    first = 0 if not f.trains else int(not f.projector) + int(tower_bwd)
    second = 0 if not f.trains else int(not f.projector) + 1
    if len(v.projector) == 1:  # Gemma 3: one projection after pooling, replicated over tp
        (i1, o1), = v.projector
        gemms += [Gemm(rows, i1, o1, 1, first)]
    else:  # LLaVA's projector, or Qwen's merger on merge^2 concatenated patches: one row per image token
        (i1, o1), (i2, o2) = v.projector
        copies = v.boundary_levels  # Qwen3-VL: the merger and each DeepStack merger
        gemms += [Gemm(rows, i1, o1 // tp, copies, first), Gemm(rows, o1 // tp, o2, copies, second)]  # column, row
    # norms (2), activation, residuals (2); the softmax over the scores apart (score_bytes)
    ew = tower * v.hidden * 8 * wl.dtype_bytes * v.layers_forward
    ops = VISION_OPS_PER_LAYER * v.layers_forward + VISION_OPS_FIXED
    # a frozen tower: the backward runs the projector's few ops only (counted as none)
    share = 1.0 if tower_bwd else 0.0
    return StageWork(tuple(g for g in gemms if g.count), ew, v.layers_forward, used if tower_bwd else 0, tower, ops,
                     share, score_elems * 3 * wl.dtype_bytes)


def language_work(spec: ModelSpec, wl: Workload, samples: int, tp: int, cp: int, causal: float,
                  sequence_parallel: bool = False, layers: int | None = None, head: bool = True,
                  ep: int = 1) -> StageWork:
    """The language stage on one rank: `samples` sequences, tp splits heads and MLP, cp the sequence.

    layers   decoder layers this rank runs (a pipeline stage's share; default all)
    head     whether this rank holds the head and the loss (the last pipeline stage)
    Element-wise work on [tokens, hidden] (norms, residuals, rotary) runs on tokens / tp per rank
    with sequence parallelism, on every token of the shard without it; on [tokens, ffn / tp]
    (SwiGLU) and the scores it is split by tp either way.
    A language stage that does not train (wl.freeze) back-propagates only to a trained encoder's
    rows: input gradients, one GEMM per linear (attention's two products have no weights: both
    of their backward products are input gradients).
    A mixture-of-experts layer (lm.moe): the router on the rank's tokens, then each of its E / ep
    experts on the assignments it receives (`moe_work`).
    """
    lm = spec.language
    n = lm.layers if layers is None else layers
    s = wl.seq_len
    tokens = samples * s // cp
    heads = lm.heads // (tp * cp)  # Ulysses: after the all-to-all a rank holds a/(tp cp) heads, full length
    q, kv = lm.heads * lm.head_dim // tp, lm.kv_heads * lm.head_dim // tp
    attn = int(round(causal * s))  # share of the causal score matrix computed, per query row
    linear = 2 if wl.freeze.of("language").trains else 1  # backward GEMMs per linear
    if lm.moe:
        mlp, mlp_ew, mlp_ops = moe_work(spec, tokens / tp if sequence_parallel else tokens, ep, linear)
        hidden_tokens = tokens / tp if sequence_parallel else tokens
        if lm.shared_ffn:  # the shared expert: a dense SwiGLU on every token, split over tp
            mlp += (Gemm(tokens, lm.hidden, 2 * lm.shared_ffn // tp, 1, linear),
                    Gemm(tokens, lm.shared_ffn // tp, lm.hidden, 1, linear))
            mlp_ew += tokens * lm.shared_ffn // tp * 3
        ew = (hidden_tokens * lm.hidden * 8 + mlp_ew) * wl.dtype_bytes
    else:
        mlp = (Gemm(tokens, lm.hidden, 2 * lm.ffn // tp, 1, linear),  # gate, up (column)
               Gemm(tokens, lm.ffn // tp, lm.hidden, 1, linear))  # down (row)
        hidden_tokens = tokens / tp if sequence_parallel else tokens
        ew, mlp_ops = (hidden_tokens * lm.hidden * 8 + tokens * lm.ffn // tp * 3) * wl.dtype_bytes, 0
    mixers = getattr(lm, "mixer_gemms", None)  # a decoder of several layer types counts its own (Qwen3.5)
    if mixers is not None:
        gemms = [Gemm(*g) for g in mixers(samples, s, tokens, tp, attn, linear, n)]
        gemms += [Gemm(g.m, g.k, g.n, g.count * n, g.backward) for g in mlp]
    else:
        layer = (
            Gemm(tokens, lm.hidden, q + 2 * kv, 1, linear),  # q, k, v (column)
            Gemm(tokens, q, lm.hidden, 1, linear),  # o (row)
            *mlp,
            Gemm(s, lm.head_dim, attn, samples * heads, kept="output"),  # scores
            Gemm(s, attn, lm.head_dim, samples * heads, kept="left"),  # probabilities x values
        )
        gemms = [Gemm(g.m, g.k, g.n, g.count * n, g.backward, kept=g.kept) for g in layer]
    if head:
        gemms.append(Gemm(tokens, lm.hidden, lm.vocab // tp, 1, linear))  # vocabulary-parallel head
    scores = samples * heads * s * attn * 3 * wl.dtype_bytes * n  # the softmax over the scores
    ew = ew * n + (tokens * lm.vocab // tp * 4 * 3 if head else 0)  # cross-entropy in fp32
    ops = (LANGUAGE_OPS_PER_LAYER + mlp_ops) * n + (LANGUAGE_OPS_FIXED if head else 0)
    return StageWork(tuple(g for g in gemms if g.count), ew, n, n, tokens, ops, score_bytes=scores)


MOE_OPS_FIXED, MOE_OPS_PER_EXPERT = 30, 8  # routing, sort, split counts, two all-to-alls, combine; per local
#                                            expert: select, gate_up, chunk, act, mul, down, scale, index_add


def moe_work(spec: ModelSpec, routed: float, ep: int, linear: int) -> tuple[tuple[Gemm, ...], float, int]:
    """(GEMMs, element-wise elements, op calls) of one MoE block on one rank, `routed` tokens routed
    here (the shard's tokens; / tp with sequence parallelism, else every tp rank routes all of them:
    the experts are replicated over tp, ds_hetero's expert-tensor-parallel size 1).

    Routing is priced balanced (dropless; the lower bound of the busiest expert rank): each rank
    receives as many (token, expert) assignments as it sends, `routed x top_k`, spread over its
    E / ep experts. The router's GEMM is replicated work on every rank that routes."""
    lm = spec.language
    local = lm.experts // ep
    rows = routed * lm.top_k  # assignments this rank's experts compute
    m, extra = divmod(max(local, round(rows)), local)  # per local expert (balanced); `extra` experts one more
    gemms = (Gemm(max(1, round(routed)), lm.hidden, lm.experts, 1, linear),  # router logits
             Gemm(m, lm.hidden, 2 * lm.moe_ffn, local, linear),  # gate, up per expert
             Gemm(m, lm.moe_ffn, lm.hidden, local, linear),  # down per expert
             Gemm(1, lm.hidden, 2 * lm.moe_ffn, extra, linear),  # the rows that do not divide evenly
             Gemm(1, lm.moe_ffn, lm.hidden, extra, linear))
    # SwiGLU on [rows, f] (3), the permuted rows in and out and the weighted combine on [rows, h] (3),
    # softmax and top-k on [routed, E] (2)
    ew = rows * lm.moe_ffn * 3 + rows * lm.hidden * 3 + routed * lm.experts * 2
    return gemms, ew, MOE_OPS_FIXED + MOE_OPS_PER_EXPERT * local


def model_flops_per_step(spec: ModelSpec, wl: Workload, causal: float) -> int:
    """Training FLOPs of one step of the whole model (one rank, tp = cp = 1, the whole batch)."""
    return (vision_work(spec, wl, wl.global_batch, 1).flops
            + language_work(spec, wl, wl.global_batch, 1, 1, causal).flops)
