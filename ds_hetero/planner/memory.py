"""Peak memory of one rank: parameters, gradients, optimizer state per ZeRO stage, activations.

Model states per parameter of a stage's tp shard (P = ModelSpec.params_per_rank: split
parameters / tp + replicated ones; the language stage's input embedding and head are split on
the vocabulary, ceil(vocab / tp) rows each, a tied matrix counted once), as DeepSpeed
allocates them with Adam (checked against a real engine in tests/planner/test_planner_distributed.py):

    ZeRO 0   parameters P, gradients P, Adam moments 2P (fp32; the torch optimizer's state)
    ZeRO 1   parameters P, gradients P, fp32 master partition P/dp, moments 2P/dp
    ZeRO 2   parameters P, gradients P/dp, fp32 master partition P/dp, moments 2P/dp
    ZeRO 3   parameters P/dp, gradients P/dp, fp32 master partition P/dp, moments 2P/dp

(dp counts the stage's dp x cp ranks, which hold the same parameters; a stage's own `zero`
overrides the config's.) Frozen parameters (wl.freeze, frozen.py) are held in the model dtype
only: whole under ZeRO 0-2 (DeepSpeed partitions the optimizer's parameters), P/dp under ZeRO 3
(which partitions every parameter of the module); a stage that does not train runs ZeRO 0. A MoE
language stage holds E / ep of each layer's experts (replicated over tp), whose gradients and
optimizer state DeepSpeed partitions over the expert-data-parallel ranks (cp x dp / ep), the dense
parameters' over dp x cp as without ep. Activations per micro-batch: activations.py (SwiGLU, GQA, sequence
parallelism, recompute). How many micro-batches a rank holds at once: `peak_memory`.

The optimizer phase (after every backward, the activations freed) allocates temporaries on top of
the states: `optimizer_transient`. A rank's peak is its states plus the larger of its activations
and its largest optimizer transient (`RankMemory.total`, `rank_peak`): on Qwen2-VL-2B's widths in
fp32 (benchmarks/plan_real_width.py) the torch AdamW step's two copies of the language's 0.65 GB
flat partition, not the activations, set the peak.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .activations import language_activation_bytes, vision_activation_bytes
from .candidate import Candidate, StageChoice
from ..models.shapes import ModelSpec, chunk_params_per_rank
from .language_mix import language_shape
from .workload import Workload, samples_per_rank


@dataclass(frozen=True)
class StateElements:
    """Elements (not bytes) one rank holds for one stage's model states."""

    params: float
    grads: float
    master: float  # fp32 copy of the partition (ZeRO >= 1)
    moments: float  # Adam exp_avg + exp_avg_sq

    def bytes(self, dtype_bytes: int) -> float:
        return (self.params + self.grads) * dtype_bytes + (self.master + self.moments) * 4


def state_bytes(trained: float, frozen: float, layout: StageChoice, zero: int, dtype_bytes: int) -> float:
    """Model-state bytes of one rank: `trained` parameters with their gradients and optimizer state,
    `frozen` ones in the model dtype (partitioned under ZeRO 3 only)."""
    held = frozen / (layout.dp * layout.cp) if zero == 3 else frozen
    return state_elements(trained, layout, zero).bytes(dtype_bytes) + held * dtype_bytes


def state_elements(params: float, layout: StageChoice, zero: int) -> StateElements:
    """`params`: what one tp rank holds (ModelSpec.params_per_rank)."""
    p = params
    n = layout.dp * layout.cp
    if zero == 0:
        return StateElements(p, p, 0.0, 2 * p)
    return StateElements(p / n if zero == 3 else p, p / n if zero >= 2 else p, p / n, 2 * p / n)


@dataclass(frozen=True)
class RankMemory:
    states: float
    activations: float
    optimizer_transient: float = 0.0  # held only while the optimizer runs, after the activations are freed
    step_transient: float = 0.0  # the part of it torch Adam's step allocates (grows with the master partition)

    @property
    def total(self) -> float:
        return rank_peak([self])


def rank_peak(parts: list[RankMemory], heap_keeps_activations: bool = False, one_engine: bool = False) -> float:
    """Peak bytes of a rank holding these stages: their states plus either every stage's activations
    (the backward) or the largest optimizer transient (the stages' optimizers run one after another,
    after every backward of the step). `one_engine` (stages/shared_engine.py: equal layouts share
    one DeepSpeed engine): one optimizer steps one flat master partition of every stage, so torch
    Adam's temporaries are the sum of the stages'. `heap_keeps_activations` (a CPU, its resident set
    measured): the C library's heap keeps the freed activations resident (memory below its mmap
    threshold is reused, not returned), so the transient comes on top of them."""
    transient = max((p.optimizer_transient for p in parts), default=0.0)
    if one_engine:
        transient = max(transient, sum(p.step_transient for p in parts))
    acts = sum(p.activations for p in parts)
    return sum(p.states for p in parts) + (acts + transient if heap_keeps_activations else max(acts, transient))


def optimizer_transient(largest: float, master: float, zero: int, torch_adam: bool) -> float:
    """Bytes the optimizer phase of one stage allocates above its states, freed before the next forward.

    `largest`: elements of the largest gradient tensor the rank holds for the stage; `master`: the
    elements of its fp32 master partition (trained parameters / (dp x cp)). Two phases, one after
    the other:
    - the gradient norm. DeepSpeed's ZeRO 1/2 norm takes each gradient of the partition to float64
      one at a time before its vector norm (deepspeed/runtime/zero/utils.py `get_norm_dtype`: fp64
      wherever the device has it, CUDA included; stage_1_and_2.py `get_grad_norm_direct`): 8 bytes
      per element of the largest; ds_hetero's ZeRO 0 norm squares a float64 copy
      (optimizer_step/clipping.py `_manual_norm_sq`): 16 bytes;
    - torch's Adam / AdamW (`torch_adam`) one tensor at a time (its path for CPU tensors) computes
      `exp_avg_sq.sqrt() / bias_correction` as two new tensors the size of the parameter it
      updates: under ZeRO 1/2 the flat fp32 partition (2 x 4 bytes x master), under ZeRO 0 each
      parameter (the largest). CUDA's foreach path allocates one such copy, DeepSpeed's fused Adam
      none: this is the upper bound.
    ZeRO 3 partitions both differently: not counted. Measured (benchmarks/plan_real_width.py, the
    resident set sampled per timeline span): Qwen2-VL-2B widths, fp32, language tp2: +1.2 GB in
    optimizer.step (2 x 0.65 GB partition) and +1.3 GB in optimizer.norm (0.93 GB: the 116.7M-row
    vocabulary shard in fp64) over the states held before it.
    """
    if zero == 3:
        return 0.0
    norm = 16 * largest if zero == 0 else 8 * min(largest, master)
    return max(norm, adam_step_transient(largest, master, zero, torch_adam))


def adam_step_transient(largest: float, master: float, zero: int, torch_adam: bool) -> float:
    """torch Adam's two temporaries (`optimizer_transient`): of the flat master partition under ZeRO
    1/2, of the largest parameter under ZeRO 0; none for another optimizer or ZeRO 3."""
    if not torch_adam or zero == 3:
        return 0.0
    return 2 * 4 * (largest if zero == 0 else master)


def largest_language_tensor(spec: ModelSpec, tp: int, embeds: bool) -> float:
    """Elements of the largest (dense) parameter of a language rank: the vocabulary shard of the
    embedding or head when it holds one (`embeds`), else an MLP or attention projection's tp shard.
    A MoE stage's stacked experts (partitioned over the expert-data-parallel ranks) are not counted."""
    lm = spec.language
    rows = -(-lm.vocab // tp) * lm.hidden if embeds else 0
    return max(rows, lm.hidden * lm.ffn / tp, lm.hidden * lm.heads * lm.head_dim / tp)


def largest_encoder_tensor(spec: ModelSpec, tp: int) -> float:
    """Elements of the largest parameter of an encoder rank: an MLP or fused qkv weight's tp shard,
    or a projector matrix's (whole when the projector is replicated)."""
    v = spec.vision
    proj_tp = 1 if v.replicated_projector else tp
    return max([v.hidden * v.ffn / tp, 3 * v.hidden * v.hidden / tp] + [i * o / proj_tp for i, o in v.projector])


def even_cut(layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage, as even as possible (the first stages take the remainder)."""
    base, extra = divmod(layers, pp)
    return tuple(base + (s < extra) for s in range(pp))


def encoder_passes_in_flight(cand: Candidate) -> int:
    """Encoder passes whose activations a rank holds at once. A pass's activations live until the
    backward of the last language micro-batch it feeds (k = micro_batches / passes of them); the
    first pipeline stage has up to pp micro-batches in flight (1F1B), spanning this many passes."""
    k = cand.micro_batches // cand.passes
    pp = cand.language.pp
    return min(cand.passes, (pp + k - 2) // k + 1)


def vision_memory(spec: ModelSpec, wl: Workload, cand: Candidate, flash: bool, in_flight: int) -> RankMemory:
    layout = cand.vision
    passes = cand.micro_batches if cand.megatron else cand.passes
    samples = samples_per_rank(wl.global_batch, layout.dp, passes)
    f = wl.freeze.of("vision")
    zero = f.zero(wl.zero if layout.zero is None else layout.zero)
    params = spec.params_per_rank("vision", layout.tp)
    frozen = f.frozen_params(params, spec.vision.projector_params_per_rank(layout.tp))
    states = state_bytes(params - frozen, frozen, layout, zero, wl.dtype_bytes)
    states += spec.vision.untrained_params() / layout.tp * wl.dtype_bytes  # the tower's unused tail is held
    act = vision_activation_bytes(spec, wl, samples, layout.tp, flash, layout.recompute)
    trained = params - frozen
    largest, master = min(largest_encoder_tensor(spec, layout.tp), trained), trained / (layout.dp * layout.cp)
    transient = optimizer_transient(largest, master, zero, wl.torch_adam) if trained else 0.0
    return RankMemory(states, act * in_flight, transient, adam_step_transient(largest, master, zero, wl.torch_adam))


def language_memory(spec: ModelSpec, wl: Workload, cand: Candidate, flash: bool, stage: int, in_flight: int
                    ) -> RankMemory:
    """Pipeline stage `stage` of the language model on one of its ranks, `in_flight` micro-batches held."""
    layout = cand.language
    cut = cand.pp_layers or even_cut(spec.language.layers, layout.pp)
    first, last = stage == 0, stage == layout.pp - 1
    samples = wl.global_batch // (layout.dp * cand.micro_batches)
    if wl.lengths:  # a length mix: the largest micro-batch a rank holds, as the runtime cuts it
        samples, wl = language_shape(spec, wl, layout, cand.micro_batches, peak=True)
    f = wl.freeze.of("language")
    zero = f.zero(wl.zero if layout.zero is None else layout.zero)
    params = chunk_params_per_rank(spec, layout.tp, cut[stage], first, last, layout.ep)
    experts = spec.language.expert_params(layout.ep, cut[stage]) if spec.language.moe else 0
    frozen = f.frozen_params(params - experts)
    states = state_bytes(params - experts - frozen, frozen, layout, zero, wl.dtype_bytes)
    if experts:  # E / ep experts per rank, their states partitioned over the expert-data-parallel ranks
        frozen = f.frozen_params(experts)
        edp = StageChoice(layout.tp, layout.edp, 1, zero=layout.zero)
        states += state_bytes(experts - frozen, frozen, edp, zero, wl.dtype_bytes)
    one = language_activation_bytes(spec, wl, samples, layout.tp, layout.cp, layout.sequence_parallel, flash,
                                    cut[stage], layout.recompute, head=last, ep=layout.ep)
    trained = params - experts - frozen  # the dense parameters' master partition (experts' apart)
    largest = min(largest_language_tensor(spec, layout.tp, first or last), trained)
    master = trained / (layout.dp * layout.cp)
    transient = optimizer_transient(largest, master, zero, wl.torch_adam) if trained else 0.0
    step = adam_step_transient(largest, master, zero, wl.torch_adam)
    if layout.recompute and cut[stage]:  # one layer's full activations exist once, not per micro-batch
        full = language_activation_bytes(spec, wl, samples, layout.tp, layout.cp, layout.sequence_parallel, flash,
                                         1, False, head=False, ep=layout.ep)
        return RankMemory(states, (one - full) * in_flight + full, transient, step)
    return RankMemory(states, one * in_flight, transient, step)


def peak_memory(spec: ModelSpec, wl: Workload, cand: Candidate, flash: bool, cache: dict | None = None,
                heap_keeps_activations: bool = False) -> dict[str, float]:
    """Peak bytes per rank set: {"all": ...} when every encoder runs on the language's ranks (a first
    stage's rank in first_stage), else the language's ranks and each apart encoder's, in rank order.

    Language stage s of a 1F1B pipeline holds min(pp - s, micro_batches) micro-batches; a language
    rank also holds every encoder it runs, each with its own passes in flight (`encoder_in_flight`:
    all ranks, or the first stage's in first_stage); an apart encoder is one more pipeline stage
    ahead of the language's (pp + 1 in flight).
    """
    first = spec.names[0]
    lang = language_peaks(spec.view(first), wl, cand.view(first), flash, cache)
    own = (lambda n: None if cache is None else cache.setdefault(("encoder cache", n), {}))
    enc = {n: encoder_peak(spec.view(n), wl.of(n), cand.view(n), flash, own(n)) for n in spec.names}
    keeps = heap_keeps_activations
    if one_engine(spec, wl, cand):  # colocated, every stage in the same layout: one engine, one optimizer
        return {"all": rank_peak([lang[0], *enc.values()], keeps, one_engine=True)}
    if cand.megatron:  # every encoder inside each micro-batch of the first stage: pp in flight
        return {"all": max([rank_peak([lang[0], *enc.values()], keeps)] + [rank_peak([m], keeps) for m in lang[1:]])}
    apart = [n for n in spec.names if cand.apart(n)]
    beside = [enc[n] for n in spec.names if n not in apart]
    here = max(rank_peak([m, *beside], keeps) for m in lang)
    if not apart:
        return {"all": here}
    sets = [("language", here, min(cand.language.ranks))] + [(n, rank_peak([enc[n]], keeps), min(cand.encoder(n).ranks))
                                                              for n in apart]
    return {name: peak for name, peak, _ in sorted(sets, key=lambda s: s[2])}


def one_engine(spec: ModelSpec, wl: Workload, cand: Candidate) -> bool:
    """Whether the runtime runs every stage in one DeepSpeed engine (stages/shared_engine.py
    `sharing_stages`): colocated, every stage's tp, cp, dp and sequence parallelism equal, no pipeline
    and no experts, ZeRO 0 (fp32) or 1 everywhere, and every stage trains."""
    if cand.placement != "colocated" or cand.language.pp > 1 or spec.language.moe:
        return False
    key = (lambda c: (c.tp, c.cp, c.dp, c.sequence_parallel, c.pp, c.ep,
                      wl.zero if c.zero is None else c.zero))
    stages = [cand.language] + [c for _, c in cand.encoders]
    zero = key(cand.language)[-1]
    if any(key(c) != key(cand.language) for c in stages) or zero not in (0, 1):
        return False
    if zero == 0 and wl.dtype_bytes != 4:
        return False  # DeepSpeed's bf16 / fp16 wrappers at ZeRO 0 keep one engine per stage
    return all(wl.freeze.of(n).trains for n in (*spec.names, "language"))


def memo(cache: dict | None, key, fn):
    """fn() once per key while planning (one Plan's search shares a cache: the stage times and
    memory of a layout repeat across thousands of candidates)."""
    if cache is None:
        return fn()
    if key not in cache:
        cache[key] = fn()
    return cache[key]


def language_peaks(spec: ModelSpec, wl: Workload, cand: Candidate, flash: bool, cache: dict | None = None
                   ) -> list[RankMemory]:
    """The memory of a rank of each language pipeline stage (its states, its 1F1B micro-batches in
    flight, its optimizer's transient)."""
    pp, m = cand.language.pp, cand.micro_batches
    lkey = ("memory", replace(cand.language, ranks=()), m, cand.pp_layers)
    return [memo(cache, lkey + (s,), lambda: language_memory(spec, wl, cand, flash, s, min(pp - s, m)))
            for s in range(pp)]


def encoder_in_flight(cand: Candidate) -> int:
    """Encoder passes a rank of the encoder holds at once: one stage ahead of a pp-stage pipeline
    when disaggregated, inside stage 0's micro-batches in first_stage, else `encoder_passes_in_flight`."""
    pp = cand.language.pp
    if cand.disaggregated:
        return min(pp + 1, cand.passes)
    if cand.megatron:
        return min(pp, cand.micro_batches)
    return encoder_passes_in_flight(cand)


def encoder_peak(spec: ModelSpec, wl: Workload, cand: Candidate, flash: bool, cache: dict | None = None
                 ) -> RankMemory:
    """The encoder's share of a rank (states, its passes in flight, its optimizer's transient).
    `cache` keys do not name the encoder: one cache per encoder (peak_memory)."""
    in_flight = encoder_in_flight(cand)
    passes = cand.micro_batches if cand.megatron else cand.passes
    return memo(cache, ("memory", replace(cand.vision, ranks=()), passes, in_flight),
                 lambda: vision_memory(spec, wl, cand, flash, in_flight))
