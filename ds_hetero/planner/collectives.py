"""Every collective of one stage on one rank: kind, bytes, group and how often (pure).

Bytes follow the alpha-beta convention of machine.py: all_reduce and reduce_scatter take the
full tensor, all_gather gives the full tensor, all_to_all moves one rank's buffer.

Tensor parallelism (ds_hetero's column/row regions, Megatron's split): per attention and per
MLP block one all-reduce of the block's [tokens, hidden] output in the forward and one of its
input gradient in the backward; the LLaVA projector / Qwen2-VL merger is one more region; the
vocabulary-parallel input embedding adds the forward all-reduce of its partial lookups, the
vocabulary-parallel head the backward all-reduce of its input gradient, and three tiny
all-reduces of [tokens] for the cross entropy (max, sum of exp, target logit). With sequence
parallelism each all-reduce becomes an all-gather plus a reduce-scatter of the same full
tensor (the same bytes on a ring; the activations between blocks are 1/tp).

Context parallelism (Ulysses all-to-all): per attention layer q, k, v go sequence- to
head-sharded and the output back, in the forward and again in the backward.

Expert parallelism (a MoE language stage, `ep`): per MoE layer the dispatch and the combine
all-to-all of the rank's (token, expert) assignments, [tokens x top_k, hidden] (the tokens each
rank routes: / tp with sequence parallelism), in the forward and their reversed exchanges in the
backward (4 per layer), plus the all-to-all of the per-expert counts before each dispatch; the
global load-balancing loss all-reduces its routing counts ([layers, E + 1] fp32) over the stage's
dp x cp ranks (x tp under sequence parallelism) once per micro-batch. Balanced routing is priced:
each rank sends and receives its own assignments' bytes (the exchange's lower bound; the share
that stays on the rank is priced as sent, as the all-to-all's (n-1)/n already discounts it).

Data parallelism (DeepSpeed): ZeRO 0 all-reduces the gradients once per step; ZeRO 1
reduce-scatters them once per step (at the accumulation boundary) and all-gathers the updated
parameters; ZeRO 2 reduce-scatters at every micro-batch; ZeRO 3 also all-gathers the
parameters in every micro-batch's forward and backward.

Frozen parameters (wl.freeze, frozen.py) have no gradient to reduce: the reductions and ZeRO
1/2's gathers of the updated partition cover the trained ones only; ZeRO 3 still gathers the
frozen ones in the forward (it partitions every parameter of the module) and in the backward
where the backward runs through them. A stage that does not train runs ZeRO 0 without an
optimizer: no dp collective; an encoder that does not train, and a frozen tower, run no backward
there: only the forward's tp all-reduces. With ep the dense parameters are reduced over dp x cp
and each rank's E / ep experts over the expert-data-parallel ranks (cp x dp / ep), DeepSpeed's MoE
groups (ZeRO 1-3 partition them over those ranks).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .candidate import StageChoice
from ..models.shapes import ModelSpec
from .workload import Workload


@dataclass(frozen=True)
class Collective:
    axis: str  # "tp", "cp", "ep", "dp", "edp" (the experts' gradients)
    kind: str
    nbytes: float
    group: int  # ranks in the group
    span: int  # consecutive ranks the group covers (tp fastest, then cp, then dp)
    count: int  # per micro-batch (tp, cp; dp with ZeRO 2/3) or per step (dp with ZeRO 0/1)
    per: str  # "micro_batch" or "step"


def _tp_regions(kind_sp: bool, nbytes: float, tp: int, count: int) -> list[Collective]:
    if tp == 1 or count == 0:
        return []
    if kind_sp:
        return [Collective("tp", "all_gather", nbytes, tp, tp, count, "micro_batch"),
                Collective("tp", "reduce_scatter", nbytes, tp, tp, count, "micro_batch")]
    return [Collective("tp", "all_reduce", nbytes, tp, tp, count, "micro_batch")]


def vision_collectives(spec: ModelSpec, wl: Workload, samples: int, layout: StageChoice) -> list[Collective]:
    v, tp = spec.vision, layout.tp
    f = wl.freeze.of("vision")
    images = samples * wl.images_per_sample(spec)
    k = wl.tokens_per_image(spec)
    tower = images * v.seq_per_image(k) * v.hidden * wl.dtype_bytes
    rows = images * k * v.projector[-1][1] * wl.dtype_bytes
    bwd = f.backward_through_tower  # the backward's regions: none after a frozen tower (nor the projector's
    #                                 input-gradient all-reduce: its input needs no gradient)
    out = _tp_regions(False, tower, tp, 2 * v.layers_forward + 2 * v.layers_backward * bwd)
    if len(v.projector) > 1:  # projector / merger: forward output, backward input gradient (Gemma 3's is replicated)
        out += _tp_regions(False, rows, tp, (1 + bwd) * v.boundary_levels)  # Qwen3-VL: each DeepStack merger too
    if not f.trains:
        return out
    params = spec.params_per_rank("vision", tp)
    frozen = f.frozen_params(params, v.projector_params_per_rank(tp))
    return out + dp_collectives(params - frozen, wl, layout, frozen, frozen_backward=bwd)


def language_collectives(spec: ModelSpec, wl: Workload, samples: int, layout: StageChoice,
                         layers: int | None = None, head: bool = True, params: float | None = None,
                         first: bool = True) -> list[Collective]:
    """`layers`, `head`, `params`, `first`: a pipeline stage's decoder layers, whether it holds the
    head, the parameters one of its tp ranks holds, and whether it holds the embedding (defaults:
    the whole language model)."""
    lm, tp, cp = spec.language, layout.tp, layout.cp
    n = lm.layers if layers is None else layers
    tokens = samples * wl.seq_len // cp
    act = tokens * lm.hidden * wl.dtype_bytes
    # blocks fwd + bwd; the head's backward (last stage) and the vocabulary-parallel embedding's
    # forward (first stage; under sp its reduce-scatter with its backward all-gather, the head's
    # all-gather with its reduce-scatter)
    out = _tp_regions(layout.sequence_parallel, act, tp, 4 * n + int(head) + int(first))
    if tp > 1 and head:
        out.append(Collective("tp", "all_reduce", tokens * 4, tp, tp, 3, "micro_batch"))  # cross entropy
    if cp > 1:
        q = tokens * lm.heads * lm.head_dim // tp * wl.dtype_bytes
        kv = tokens * lm.kv_heads * lm.head_dim // tp * wl.dtype_bytes
        for nbytes in (q, kv, kv, q):  # q, k, v in, attention output back
            out.append(Collective("cp", "all_to_all", nbytes, cp, tp * cp, 2 * n, "micro_batch"))
    if lm.moe:
        out += expert_collectives(spec, wl, tokens, layout, n)
    if params is None:
        params = spec.params_per_rank("language", tp, layout.ep)
    f = wl.freeze.of("language")
    if not f.trains:
        return out
    if lm.moe:  # the experts reduced over the expert-data-parallel ranks, the rest over dp x cp
        experts = lm.expert_params(layout.ep, n)
        edp = StageChoice(layout.tp, layout.edp, 1, ranks=layout.ranks, zero=layout.zero)
        frozen = f.frozen_params(params - experts)
        out += dp_collectives(params - experts - frozen, wl, layout, frozen, frozen_backward=True)
        frozen = f.frozen_params(experts)
        return out + [replace(c, axis="edp", span=layout.tp * layout.cp * layout.dp)
                      for c in dp_collectives(experts - frozen, wl, edp, frozen, frozen_backward=True)]
    frozen = f.frozen_params(params)
    return out + dp_collectives(params - frozen, wl, layout, frozen, frozen_backward=True)


def expert_collectives(spec: ModelSpec, wl: Workload, tokens: float, layout: StageChoice, layers: int
                       ) -> list[Collective]:
    """The expert-parallel exchanges of `layers` MoE layers per micro-batch (see the module's text)."""
    lm, tp, ep = spec.language, layout.tp, layout.ep
    routed = tokens / tp if layout.sequence_parallel else tokens
    out = []
    if ep > 1:
        rows = routed * lm.top_k * lm.hidden * wl.dtype_bytes
        out += [Collective("ep", "all_to_all", rows, ep, tp * ep, 4 * layers, "micro_batch"),
                Collective("ep", "all_to_all", lm.experts * 8, ep, tp * ep, layers, "micro_batch")]  # counts
    aux = layout.dp * layout.cp * (tp if layout.sequence_parallel else 1)
    if aux > 1:
        out.append(Collective("ep", "all_reduce", lm.layers * (lm.experts + 1) * 4, aux, tp * layout.cp * layout.dp,
                              1, "micro_batch"))
    return out


def dispatch_bytes(spec: ModelSpec, wl: Workload, samples: int, layout: StageChoice) -> tuple[float, float]:
    """(bytes one rank sends per micro-batch in the dispatch all-to-alls, their lower bound: the share
    bound for other ranks), forward dispatch only, every MoE layer: the figure bench_moe.py measures."""
    lm = spec.language
    tokens = samples * wl.seq_len / layout.cp
    routed = tokens / layout.tp if layout.sequence_parallel else tokens
    sent = routed * lm.top_k * lm.hidden * wl.dtype_bytes * lm.layers
    return sent, sent * (layout.ep - 1) / layout.ep


def dp_collectives(params: float, wl: Workload, layout: StageChoice, frozen: float = 0.0,
                   frozen_backward: bool = True) -> list[Collective]:
    """Gradient reduction (and ZeRO's parameter gathers) of one stage over its dp x cp ranks;
    `params` = the trained parameters one tp rank holds, `frozen` its frozen ones (ZeRO 3 gathers
    them in the forward, and in the backward when `frozen_backward`: the backward runs through them)."""
    n = layout.dp * layout.cp  # cp ranks hold the same parameters and reduce gradients with dp
    if n == 1:
        return []
    nbytes = params * wl.dtype_bytes
    span = layout.tp * layout.cp * layout.dp
    z = wl.zero if layout.zero is None else layout.zero
    if z == 0:
        return [Collective("dp", "all_reduce", nbytes, n, span, 1, "step")]
    if z == 1:
        return [Collective("dp", "reduce_scatter", nbytes, n, span, 1, "step"),
                Collective("dp", "all_gather", nbytes, n, span, 1, "step")]
    if z == 2:
        return [Collective("dp", "reduce_scatter", nbytes, n, span, 1, "micro_batch"),
                Collective("dp", "all_gather", nbytes, n, span, 1, "step")]
    if not frozen:
        return [Collective("dp", "reduce_scatter", nbytes, n, span, 1, "micro_batch"),
                Collective("dp", "all_gather", nbytes, n, span, 2, "micro_batch")]  # forward and backward
    held = (params + frozen) * wl.dtype_bytes
    return [Collective("dp", "reduce_scatter", nbytes, n, span, 1, "micro_batch"),
            Collective("dp", "all_gather", held, n, span, 1, "micro_batch"),  # forward: every parameter
            Collective("dp", "all_gather", held if frozen_backward else nbytes, n, span, 1, "micro_batch")]
