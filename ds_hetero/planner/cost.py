"""The cost model: one candidate -> predicted step time, throughput, memory and where the time goes.

Per stage and micro-batch, on one rank: GEMM time (machine roofline of every GEMM of flops.py,
backward = the forward's GEMMs twice), element-wise time (bytes over memory bandwidth), tp/cp
collectives (collectives.py over the machine's alpha-beta model); per step the dp gradient
reduction and the optimizer (Adam reads and writes ~36 bytes per parameter of the partition:
fp32 master, moments, parameter and gradient). The boundary costs one all-to-all per direction
over the union of both stages (bytes from the boundary's own plan); `engine_syncs` adds the
engine's per-step agreement and norm all-reduces. pipeline.py
combines them.

Devices that share compute units (CPU ranks on fewer cores than ranks) cannot all compute at
once: the step is then at least the busy seconds of all ranks over the compute units.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..config import HeteroConfig
from .boundary_cost import boundary_rows
from .candidate import Candidate, StageChoice
from .collectives import Collective, language_collectives, vision_collectives
from .flops import StageWork, language_work, model_flops_per_step, vision_work
from .machine import MachineProfile
from .memory import peak_memory, state_elements
from .model_spec import ModelSpec
from .pipeline import StageTimes, colocated_step, disaggregated_step
from .workload import Workload

ADAM_BYTES_PER_PARAM = 36  # read + write of fp32 master, two moments, parameter, gradient (approximately)


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

    @property
    def max_memory(self) -> float:
        return max(self.peak_memory.values())


def _gemm_seconds(work: StageWork, machine: MachineProfile) -> tuple[float, float]:
    fwd = bwd = 0.0
    for g in work.gemms:
        t = machine.gemm_time(g.m, g.k, g.n, g.count)
        fwd += t
        bwd += t * g.backward
    ew = machine.memory_time(work.elementwise_bytes)
    calls = work.ops * machine.op_overhead
    return fwd + ew + calls, bwd + 2 * ew + 2 * calls


def _collective_seconds(colls: list[Collective], machine: MachineProfile) -> dict[str, float]:
    """{"tp": s per micro-batch, "cp": ..., "dp_mb": per micro-batch, "dp_step": per step}."""
    out = {"tp": 0.0, "cp": 0.0, "dp_mb": 0.0, "dp_step": 0.0}
    for c in colls:
        t = c.count * machine.collective_time(c.kind, c.nbytes, c.group, c.span)
        key = c.axis if c.axis != "dp" else ("dp_mb" if c.per == "micro_batch" else "dp_step")
        out[key] += t
    return out


def stage_times(spec: ModelSpec, wl: Workload, machine: MachineProfile, stage: str, layout: StageChoice,
                micro_batches: int) -> tuple[StageTimes, dict[str, float]]:
    """One stage on one of its ranks: (times per micro-batch and per step, breakdown per step)."""
    m = micro_batches
    samples = wl.global_batch // (layout.dp * m)
    if stage == "vision":
        work = vision_work(spec, wl, samples, layout.tp)
        colls = vision_collectives(spec, wl, samples, layout)
    else:
        work = language_work(spec, wl, samples, layout.tp, layout.cp, machine.causal)
        colls = language_collectives(spec, wl, samples, layout)
    fwd, bwd = _gemm_seconds(work, machine)
    c = _collective_seconds(colls, machine)
    st = state_elements(spec.params_per_rank(stage, layout.tp), layout, wl.zero)
    optimizer = machine.memory_time((st.master if wl.zero else st.params) * ADAM_BYTES_PER_PARAM)
    # tp / cp collectives split evenly over forward and backward; per micro-batch dp in the backward
    times = StageTimes(forward=fwd + (c["tp"] + c["cp"]) / 2, backward=bwd + (c["tp"] + c["cp"]) / 2 + c["dp_mb"],
                       step=c["dp_step"] + optimizer)
    return times, {"compute": m * (fwd + bwd), "tp": m * c["tp"], "cp": m * c["cp"],
                   "dp": m * c["dp_mb"] + c["dp_step"], "optimizer": optimizer}


def engine_syncs(cand: Candidate, machine: MachineProfile, world: int) -> float:
    """Small all-reduces HeteroEngine.train_batch runs once per step: the batch agreement (sample
    checks, batch size, label count) and the global norm + loss, over all ranks; the clipping
    norm of each stage with tp > 1 (its tp group)."""
    tiny = 64
    t = 2 * machine.collective_time("all_reduce", tiny, world)
    for layout in (cand.vision, cand.language):
        t += machine.collective_time("all_reduce", tiny, layout.tp)
    return t


def predict(cand: Candidate, cfg: HeteroConfig, spec: ModelSpec, wl: Workload, machine: MachineProfile,
            memory_limit: float | None = None) -> Prediction:
    m = cand.micro_batches
    times: dict[str, StageTimes] = {}
    breakdown: dict[str, dict[str, float]] = {}
    for stage, layout in (("vision", cand.vision), ("language", cand.language)):
        times[stage], breakdown[stage] = stage_times(spec, wl, machine, stage, layout, m)

    fwd_rows, bwd_rows = boundary_rows(cfg, wl.image_tokens, wl.seq_len)
    row_bytes = spec.language.hidden * spec.vision.boundary_levels * wl.dtype_bytes  # Qwen3-VL: + DeepStack levels
    peers = len(set(cand.vision.ranks) | set(cand.language.ranks)) or cfg.world_size
    # each exchange is one all-to-all (its shape consensus runs on the first step only)
    per_exchange = [machine.collective_time("all_to_all", rows * row_bytes / peers, peers)
                    for rows in (fwd_rows, bwd_rows)]
    boundary = sum(per_exchange)
    world = cfg.world_size
    syncs = engine_syncs(cand, machine, world)
    if cand.disaggregated:
        step, busy_v, busy_l = disaggregated_step(times["vision"], times["language"], boundary, m)
        step += syncs
        total_busy = busy_v * len(cand.vision.ranks) + busy_l * len(cand.language.ranks)
    else:
        step, busy = colocated_step(times["vision"], times["language"], boundary, m)
        total_busy = busy * world
    step += syncs
    if machine.compute_units and machine.compute_units < world:
        step = max(step, total_busy / machine.compute_units)
    if cand.disaggregated:
        bubble = max(1 - busy_v / step, 1 - busy_l / step)
        breakdown["vision"]["bubble"] = step - busy_v
        breakdown["language"]["bubble"] = step - busy_l
    else:
        bubble = max(0.0, 1 - total_busy / world / step) if step else 0.0
    for stage in breakdown:
        breakdown[stage]["boundary"] = m * boundary + syncs
    memory = peak_memory(spec, wl, cand, machine.flash_attention)
    flops = model_flops_per_step(spec, wl, machine.causal)
    limit = memory_limit if memory_limit is not None else machine.memory_bytes
    return Prediction(
        candidate=cand, step_s=step, tokens_per_s=wl.global_batch * wl.seq_len / step,
        tflops_per_device=flops / step / world / 1e12, peak_memory=memory,
        boundary_bytes=(fwd_rows + bwd_rows) * row_bytes * m, bubble=bubble, breakdown=breakdown,
        fits=max(memory.values()) <= limit,
    )
