"""The cost model's parts: the time of one stage on one rank (step_model.py combines them).

Per stage and micro-batch, on one rank: GEMM time (machine.py's shape-aware time of every GEMM of
flops.py: tile and wave quantization on GPUs, this machine's measured curve when calibrated;
backward = the forward's GEMMs twice), element-wise time (bytes over memory bandwidth), tp/cp
collectives (collectives.py over the machine's alpha-beta model); per step the dp gradient
reduction and the optimizer (a fused Adam reads and writes ~36 bytes per parameter of the partition:
fp32 master, moments, parameter and gradient; torch's unfused Adam 96; the gradient norm in float64
20 per gradient element). The boundary costs one all-to-all per direction
over the union of both stages (bytes from the boundary's own plan); `engine_syncs` adds the
engine's per-step agreement and norm all-reduces. step_model.py combines them (step_time.py).

Devices that share compute units (CPU ranks on fewer cores than ranks) cannot all compute at
once: the step is then at least the busy seconds of all ranks over the compute units.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from .candidate import Candidate, StageChoice
from .collectives import Collective, language_collectives, vision_collectives
from .flops import StageWork, language_work, vision_work
from .machine import MachineProfile
from .activations import language_activation_bytes, vision_activation_bytes
from .memory import state_elements
from ..models.shapes import ModelSpec, chunk_params_per_rank
from .step_time import StageTimes
from .language_mix import language_shape
from .workload import Workload, samples_per_rank

ADAM_BYTES_PER_PARAM = 36  # read + write of fp32 master, two moments, parameter, gradient (approximately)
# torch's Adam / AdamW one tensor at a time (`"torch_adam": true`; its path for CPU tensors,
# torch/optim/adam.py _single_tensor_adam), bytes per element of the fp32 master partition: weight
# decay param.mul_ 8, exp_avg.lerp_ 12, exp_avg_sq.mul_ 8 + addcmul_ 12, sqrt 8 and the division 8
# (two new tensors), add_(eps) 8, param.addcdiv_ 16 (80); DeepSpeed's clip of the flat gradient 8
# and its copy of the master back into the parameters 8
TORCH_ADAM_BYTES_PER_PARAM = 96
# the gradient norm DeepSpeed's ZeRO 1/2 takes in float64 (zero/utils.py get_norm_dtype): each
# gradient read (4), copied to float64 (8) and read again by the norm (8)
NORM_BYTES_PER_GRAD = 20


@dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    step_s: float
    tokens_per_s: float
    tflops_per_device: float
    peak_memory: Mapping[str, float]  # bytes per rank, per rank set
    boundary_bytes: float  # per step, all ranks, forward + backward
    bubble: float  # largest idle share of a rank set (disaggregated), 0 colocated
    breakdown: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # stage -> part -> s per step
    fits: bool = True
    runnable: bool = True  # the engine's checks accept it today (else modelled only)

    @property
    def max_memory(self) -> float:
        return max(self.peak_memory.values())


def compute_parts(work: StageWork, machine: MachineProfile) -> dict[str, tuple[float, float]]:
    """(forward, backward) seconds of one pass of `work` per part: "gemm" (the shape-aware GEMM time),
    "elementwise" (bytes over memory bandwidth) and "launches" (operator calls x op_overhead)."""
    fwd = bwd = 0.0
    layers = max(1, work.layers_forward)
    for g in work.gemms:
        # the products of one layer run in one kernel (attention over heads and samples, a grouped GEMM
        # over experts), each layer's in its own: what the GPU's wave quantization sees (machine.py)
        t = machine.gemm_time(g.m, g.k, g.n, g.count, max(1, g.count // layers), g.kept)
        fwd += t * g.forward
        bwd += t * g.backward
    # the scores' softmax passes reach memory only without flash attention (machine.py, FlashAttention)
    ew = machine.memory_time(work.elementwise_bytes + (0.0 if machine.flash_attention else work.score_bytes))
    calls = work.ops * machine.op_overhead
    return {"gemm": (fwd, bwd), "elementwise": (ew, 2 * ew * work.backward_share),
            "launches": (calls, 2 * calls * work.backward_share)}


def _gemm_seconds(work: StageWork, machine: MachineProfile) -> tuple[float, float]:
    parts = compute_parts(work, machine)
    if machine.overlap_launches:  # the host enqueues while the device runs (machine.py): the slower of the two
        device = [parts["gemm"][i] + parts["elementwise"][i] for i in (0, 1)]
        return max(device[0], parts["launches"][0]), max(device[1], parts["launches"][1])
    values = parts.values()
    return sum(f for f, _ in values), sum(b for _, b in values)


def _collective_seconds(colls: list[Collective], machine: MachineProfile) -> dict[str, float]:
    """{"tp": s per micro-batch, "cp": ..., "ep": ..., "dp_mb": per micro-batch, "dp_step": per step}
    (the experts' gradient reduction, axis "edp", counts as dp)."""
    out = {"tp": 0.0, "cp": 0.0, "ep": 0.0, "dp_mb": 0.0, "dp_step": 0.0}
    for c in colls:
        t = c.count * machine.collective_time(c.kind, c.nbytes, c.group, c.span)
        key = c.axis if c.axis not in ("dp", "edp") else ("dp_mb" if c.per == "micro_batch" else "dp_step")
        out[key] += t
    return out


def zero_of(wl: Workload, layout: StageChoice, stage: str | None = None) -> int:
    """The stage's ZeRO stage: its own, else the config's; 0 for a stage that does not train (frozen.py)."""
    zero = wl.zero if layout.zero is None else layout.zero
    return zero if stage is None else wl.freeze.of(stage).zero(zero)


def stage_times(spec: ModelSpec, wl: Workload, machine: MachineProfile, stage: str, layout: StageChoice,
                micro_batches: int, layers: int | None = None, first: bool = True, last: bool = True
                ) -> tuple[StageTimes, dict[str, float]]:
    """One stage on one of its ranks: (times per pass and per step, breakdown per step).

    micro_batches   this stage's passes per step (an encoder's may be fewer than the language's)
    layers, first, last   a language pipeline stage: its decoder layers, embedding, head
    With recompute the backward runs the forward again first (compute and tp/cp collectives).
    Frozen parameters (wl.freeze, frozen.py) have no optimizer time; a frozen tower no backward
    (nor its recompute, nor its tp collectives' backward half).
    """
    m = micro_batches
    samples = samples_per_rank(wl.global_batch, layout.dp, m)
    zero = zero_of(wl, layout, stage)
    f = wl.freeze.of(stage)
    tp_bwd = 0.5  # tp / cp collectives split evenly over forward and backward
    if stage == "vision":
        work = vision_work(spec, wl, samples, layout.tp)
        colls = vision_collectives(spec, replace(wl, zero=zero), samples, layout)
        params = spec.params_per_rank("vision", layout.tp)
        projector = spec.vision.projector_params_per_rank(layout.tp)
        if not f.backward_through_tower:  # the tower's backward regions are not in colls (forward only)
            tp_bwd = 0.0
    else:
        n = spec.language.layers if layers is None else layers
        if wl.lengths:  # a length mix: the slowest language dp rank as the runtime cuts it (language_mix.py)
            samples, wl = language_shape(spec, wl, layout, m)
        params = chunk_params_per_rank(spec, layout.tp, n, first, last, layout.ep)
        work = language_work(spec, wl, samples, layout.tp, layout.cp, machine.causal, layout.sequence_parallel,
                             n, last, layout.ep)
        colls = language_collectives(spec, replace(wl, zero=zero), samples, layout, n, last, params, first)
        projector = 0.0
    fwd, bwd = _gemm_seconds(work, machine)
    c = _collective_seconds(colls, machine)
    st = state_elements(params - f.frozen_params(params, projector), layout, zero)  # the trained ones only
    if stage != "vision" and spec.language.moe and zero:  # the experts' partition is over the edp ranks
        experts = spec.language.expert_params(layout.ep, n)
        dense = state_elements(params - experts - f.frozen_params(params - experts), layout, zero)
        mine = state_elements(experts - f.frozen_params(experts), expert_layout(layout), zero)
        st = replace(dense, master=dense.master + mine.master)
    per_param = TORCH_ADAM_BYTES_PER_PARAM if wl.torch_adam else ADAM_BYTES_PER_PARAM
    optimizer = machine.memory_time((st.master if zero else st.params) * per_param
                                    + (st.master if zero else st.grads) * NORM_BYTES_PER_GRAD) if f.trains else 0.0
    if machine.first_touch and f.trains:  # pages the step maps fresh (CPU): its own breakdown part
        if stage == "vision":
            act = vision_activation_bytes(spec, wl, samples, layout.tp, machine.flash_attention, layout.recompute)
        else:
            act = language_activation_bytes(spec, wl, samples, layout.tp, layout.cp, layout.sequence_parallel,
                                             machine.flash_attention, n, layout.recompute, head=last, ep=layout.ep)
        touch = machine.first_touch * first_touch_bytes(st, m * act, zero, wl)
    else:
        touch = 0.0
    optimizer += touch
    tpcp = c["tp"] + c["cp"] + c["ep"]
    # with recompute the backward first runs the forward again, where it reaches (not a frozen tower)
    redo = fwd + tpcp * (1 - tp_bwd) if layout.recompute and tp_bwd else 0.0
    # per micro-batch dp in the backward
    times = StageTimes(forward=fwd + tpcp * (1 - tp_bwd),
                       backward=bwd + tpcp * tp_bwd + c["dp_mb"] + redo, step=c["dp_step"] + optimizer)
    again = 1 + (1 - tp_bwd) if redo else 1  # recompute repeats the forward's collectives
    parts = {"compute": m * (fwd + bwd + redo), "tp": m * c["tp"] * again,
             "cp": m * c["cp"] * again, "dp": m * c["dp_mb"] + c["dp_step"], "optimizer": optimizer - touch,
             "first touch": touch}
    if stage != "vision" and spec.language.moe:
        parts["ep"] = m * c["ep"] * again
    return times, parts


def first_touch_bytes(st, activations: float, zero: int, wl: Workload) -> float:
    """Bytes one rank of a stage writes into freshly mapped memory per step on a CPU (the C library maps
    every tensor above its mmap threshold, 32 MiB at most, fresh and unmaps it when freed): the
    gradients autograd allocates in the backward and, under ZeRO 1/2, the contiguous partition buffer
    DeepSpeed copies them into (both freed after the step), the float64 copies the ZeRO 1/2 norm makes
    of them (8 bytes per element), torch Adam's two temporaries per master element (memory.py
    `optimizer_transient`), the activations and, in the backward, a gradient of each. Those below
    the threshold come back from the C library's heap without faulting; not counted: a tied
    embedding's second gradient, temporaries the forward does not keep (the loss's softmax). On
    Qwen2-VL-2B's widths (benchmarks/plan_real_width.py) this counts 6.0 GB per step where the rank
    faulted in 8.5-8.7 GB: a lower bound."""
    partition = st.master * wl.dtype_bytes if zero in (1, 2) else 0.0
    norm = 8 * (st.master if zero in (1, 2) else 0.0)
    adam = 8 * (st.master if zero else st.params) if wl.torch_adam else 0.0
    return st.grads * wl.dtype_bytes + partition + norm + adam + 2 * activations


def expert_layout(layout: StageChoice) -> StageChoice:
    """The layout the experts' states are partitioned over: their expert-data-parallel ranks."""
    return StageChoice(layout.tp, layout.edp, 1, zero=layout.zero, pp=layout.pp)


def engine_syncs(cand: Candidate, machine: MachineProfile, world: int) -> float:
    """Small all-reduces HeteroEngine.train_batch runs once per step: the batch agreement (sample
    checks, batch size, label count) and the global norm + loss, over all ranks; the clipping
    norm of each stage with tp > 1 (its tp group)."""
    tiny = 64
    t = 2 * machine.collective_time("all_reduce", tiny, world)
    encoders = [machine.collective_time("all_reduce", tiny, e.tp) for _, e in cand.encoders]
    language = machine.collective_time("all_reduce", tiny, cand.language.tp)
    # the sums in the order the planner has always added them (one encoder: encoder, language;
    # several: language, encoders), so that rows of equal predicted time keep their order
    return t + encoders[0] + language if len(encoders) == 1 else t + language + sum(encoders)
