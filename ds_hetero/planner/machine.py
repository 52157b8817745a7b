"""Machine profiles: what a device computes and how fast its links move bytes.

Named GPU profiles carry datasheet figures (sources next to each number) and an achievable
fraction of peak for large GEMMs; `cpu` is a rough nominal profile for a laptop-class core;
`calibrate` (calibrate.py) measures this machine and returns a profile of the same type with
fitted per-collective timings.

Alpha-beta model (alpha: latency per step of a ring, beta: 1 / bandwidth), n ranks, B bytes:

    all_reduce      2 (n-1) alpha + 2 (n-1)/n B / bw       (ring: reduce-scatter + all-gather)
    all_gather      (n-1) alpha + (n-1)/n B / bw           (B = the gathered, full tensor)
    reduce_scatter  (n-1) alpha + (n-1)/n B / bw           (B = the full input)
    all_to_all      (n-1) alpha + (n-1)/n B / bw           (B = one rank's buffer)

plus, on GPU profiles, a fixed latency per call (`call_latency`: NCCL's own tuning model,
src/graph/tuning.cc, charges a base latency per collective call before its per-step latencies: 6.6 us
for a ring with the LL protocol small messages use, 8.4 us with Simple). The number of calls per layer
and micro-batch is collectives.py's `Collective.count`, so a small tensor-parallel tower pays its two
all-reduces per layer per micro-batch even when their bytes are few.

A group whose ranks all sit in one node (ranks are numbered node by node, tp fastest) uses the
node's link (NVLink), otherwise the network per GPU. A calibrated profile replaces the formula
by its measured fit t = a + b B per (collective, group size) (a: that machine's per-call latency).

GEMM time depends on the shape (`gemm_time`), not one flat efficiency:
- GPU profiles (`sms` > 0): NVIDIA's "Matrix Multiplication Background User's Guide"
  (docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication, DU-09799-001,
  sections 2.3 and 3): cuBLAS splits the [m, n] output into tiles (256x128 down to 64x64), each SM
  computes one tile at a time; *tile quantization*: a dimension that is not a multiple of the tile
  still pays for the whole last tile; *wave quantization*: the tiles run in waves of one per SM, so
  a GEMM of 133 tiles on 132 SMs takes two waves. The time is the best tile's number of waves times
  one tile's work at the large-GEMM rate per SM (`gemm_efficiency` x peak / sms), or the bytes
  over memory bandwidth when that is longer (the guide's math / memory bound, section 2). Attention
  under flash attention (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention
  with IO-Awareness", section 3.1: the [s, s] scores and probabilities stay in on-chip SRAM, never
  written to or read from HBM) moves only q, k, v and the output: its two products' memory traffic
  leaves out the scores (`kept`), so a long image's attention is no longer priced memory-bound by
  a score matrix the kernel never stores. The
  products of one layer that one kernel batches (attention over heads and samples, a grouped
  GEMM over experts: `batch`) share their waves; different layers are different kernels.
  Every tile size is taken at the large-GEMM rate per SM (the guide: smaller tiles are less
  efficient), so small GEMMs are priced optimistically by that much.
- a calibrated profile: the rate measured on this machine against the GEMM's smallest dimension
  (`gemm_curve`, calibrate.py), interpolated; the nominal `cpu` profile: one rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping

GB = 1e9


@dataclass(frozen=True)
class MachineProfile:
    name: str
    peak_flops: float  # dense bf16 (GPU) or fp32 (CPU) FLOP/s of one device
    gemm_efficiency: float  # fraction of peak a large GEMM achieves
    memory_bytes: float  # device memory (HBM) per device
    memory_bw: float  # bytes/s of device memory
    intra_bw: float  # bytes/s per device and direction inside a node (NVLink)
    inter_bw: float  # bytes/s per device across nodes (network)
    devices_per_node: int
    alpha_intra: float = 2e-6  # s per ring step inside a node
    alpha_inter: float = 6e-6  # s per ring step across nodes
    op_overhead: float = 5e-6  # s per operator call of the forward: kernel launch (GPU), dispatch + autograd (CPU)
    causal: float = 0.5  # share of the causal score matrix the attention kernel computes
    flash_attention: bool = True  # scores are not stored for the backward
    compute_units: int = 0  # devices that compute at once (0: every rank has its own)
    dtype_bytes: int = 2  # bf16 on GPUs; fp32 on CPU
    source: str = ""
    # calibrated: {kind: {group size: (a seconds, b seconds per byte)}}
    collectives: Mapping[str, Mapping[int, tuple[float, float]]] = field(default_factory=dict)
    gemm_fit: tuple[float, float] | None = None  # calibrated (overhead s, FLOP/s) of this machine's GEMMs
    sms: int = 0  # streaming multiprocessors (GPU datasheet): tile and wave quantization; 0: none (CPU)
    call_latency: float = 0.0  # s per collective call beyond its ring steps (NCCL's base latency)
    # calibrated: ((smallest GEMM dimension, FLOP/s), ...) measured on this machine, ascending
    gemm_curve: tuple[tuple[int, float], ...] = ()
    # s per byte a rank writes into memory it has not touched before (a page fault per page): on the
    # CPU the C library maps a large tensor fresh and unmaps it when freed, so every step faults in its
    # gradients, optimizer temporaries and large activations again (calibrate measures it); 0 where a
    # caching allocator keeps the memory (GPU profiles)
    first_touch: float = 0.0
    # the memory is a CPU process's resident set: the C library's heap keeps the backward's freed
    # activations resident into the optimizer phase (memory.py rank_peak); False where a caching
    # allocator's allocated bytes are what counts (max_memory_allocated, the GPU profiles)
    heap_keeps_activations: bool = False
    # kernel launches overlap device work: a pass costs the larger of its device time (GEMMs, element-wise)
    # and its launches' host time (operator calls x op_overhead), not their sum. PyTorch's CUDA ops are
    # asynchronous (PyTorch docs, "CUDA semantics: Asynchronous execution"; CUDA C++ Programming Guide,
    # "Asynchronous Concurrent Execution"): the host enqueues a kernel and goes on, so launches cost time
    # only where the host, not the device, is the slower of the two. False (the profiles' default): the
    # sum, an upper bound that also covers host-device synchronizations (a `.tolist()` of split sizes, a
    # loss `.item()`), which drain the queue; True: the lower bound, no synchronization. plan_public.py
    # prices the published runs with both.
    overlap_launches: bool = False

    def gemm_time(self, m: int, k: int, n: int, count: int = 1, batch: int = 1, kept: str = "") -> float:
        """Seconds of `count` [m,k]x[k,n] products, `batch` of them per kernel (module docstring): the
        larger of compute (shape-aware) and memory traffic. The per-call launch overhead is charged per
        operator call (flops.StageWork.ops x op_overhead). `kept`: the operand a fused attention kernel
        keeps on chip ("output": the scores of q k^T, "left": the probabilities of p v), which moves no
        memory traffic (flops.Gemm.kept; only where the machine runs flash attention)."""
        if count == 0:
            return 0.0
        batch = max(1, min(batch, count))
        left, right, out = m * k, k * n, m * n
        if kept and self.flash_attention:
            left, out = (left, 0) if kept == "output" else (0, out)
        moved = batch * (left + right + out) * self.dtype_bytes
        if self.sms:
            compute = self._tiled_seconds(m, k, n, batch)
        else:
            compute = batch * 2.0 * m * k * n / self.gemm_rate(m, k, n)
        return count / batch * max(compute, moved / self.memory_bw)

    def _tiled_seconds(self, m: int, k: int, n: int, batch: int) -> float:
        """One kernel of `batch` products on a GPU: the best cuBLAS-style tile's waves x one tile's work."""
        per_sm = self.peak_flops * self.gemm_efficiency / self.sms
        best = math.inf
        for tm, tn in GEMM_TILES:
            tiles = batch * -(-m // tm) * -(-n // tn)
            waves = -(-tiles // self.sms)
            best = min(best, waves * 2.0 * tm * tn * k / per_sm)
        return best

    def gemm_rate(self, m: int, k: int, n: int) -> float:
        """FLOP/s of one product off a GPU: this machine's measured curve at its smallest dimension
        (log-linear between measured points, the end points beyond), else one rate."""
        if self.gemm_curve and min(m, k, n) < self.gemm_curve[-1][0]:  # wider: the large GEMMs' fitted rate
            return _curve_rate(self.gemm_curve, min(m, k, n))
        return self.gemm_fit[1] if self.gemm_fit is not None else self.peak_flops * self.gemm_efficiency

    def memory_time(self, nbytes: float) -> float:
        return nbytes / self.memory_bw

    def collective_time(self, kind: str, nbytes: float, n: int, span: int | None = None) -> float:
        """Seconds for one collective over n ranks; `span` = how many consecutive ranks it covers."""
        if n <= 1:
            return 0.0
        fit = self.collectives.get(kind, {})
        if fit:
            a, b = _interpolate(fit, n)
            return a + b * nbytes
        inside = (span or n) <= self.devices_per_node
        alpha = self.alpha_intra if inside else self.alpha_inter
        bw = self.intra_bw if inside else self.inter_bw
        share = (n - 1) / n
        if kind == "all_reduce":
            return self.call_latency + 2 * (n - 1) * alpha + 2 * share * nbytes / bw
        if kind in ("all_gather", "reduce_scatter", "all_to_all"):
            return self.call_latency + (n - 1) * alpha + share * nbytes / bw
        raise ValueError(f"unknown collective {kind!r}")

    def with_calibration(self, **kw) -> "MachineProfile":
        return replace(self, **kw)


def _interpolate(fit: Mapping[int, tuple[float, float]], n: int) -> tuple[float, float]:
    """The fit of the nearest measured group sizes, scaled like the ring formula in between."""
    sizes = sorted(int(k) for k in fit)
    if n in fit:
        return fit[n]
    below = [s for s in sizes if s < n]
    ref = below[-1] if below else sizes[0]
    a, b = fit[ref]
    # steps grow with n - 1, the per-rank share with (n-1)/n
    return a * (n - 1) / (ref - 1 if ref > 1 else 1), b * ((n - 1) / n) / ((ref - 1) / ref if ref > 1 else 1)


def _curve_rate(curve: tuple[tuple[int, float], ...], dim: int) -> float:
    """The measured rate at `dim`, log-linear in the dimension between measured points."""
    if dim <= curve[0][0]:
        return curve[0][1]
    for (d0, r0), (d1, r1) in zip(curve, curve[1:]):
        if dim <= d1:
            w = math.log(dim / d0) / math.log(d1 / d0)
            return r0 + w * (r1 - r0)
    return curve[-1][1]


# cuBLAS's output tiles (NVIDIA, Matrix Multiplication Background User's Guide, section 2.3: 256x128
# and 128x256 the most efficient, down to 64x64 for small outputs)
GEMM_TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
# NCCL's base latency of one collective call (src/graph/tuning.cc, baseLat, Ring / LL: the protocol
# NCCL picks for the small messages where this term matters)
NCCL_CALL_LATENCY = 6.6e-6

# Datasheet figures. Achievable fraction: cuBLAS bf16 GEMMs of LLM size reach ~70-75% of the
# dense peak on H100/H200 and ~80% on A100 (NVIDIA's published GEMM benchmarks; Megatron-LM
# reports 40-55% model FLOPs utilisation end to end, the rest being communication and
# element-wise work, which this model counts separately).
PROFILES: dict[str, MachineProfile] = {
    "h100": MachineProfile(
        name="h100", peak_flops=989e12, gemm_efficiency=0.70, memory_bytes=80 * GB, memory_bw=3.35e12,
        intra_bw=450 * GB * 0.8, inter_bw=50 * GB * 0.8, devices_per_node=8, sms=132, call_latency=NCCL_CALL_LATENCY,
        source="NVIDIA H100 SXM5 datasheet: 989 TFLOPS dense BF16, 132 SMs, 80 GB HBM3 at 3.35 TB/s, NVLink 4 "
               "900 GB/s bidirectional (450 GB/s per direction); DGX H100 networking 8x ConnectX-7 400 Gb/s "
               "(50 GB/s per GPU); 80% of link rate as NCCL bus bandwidth (nccl-tests)"),
    "h200": MachineProfile(
        name="h200", peak_flops=989e12, gemm_efficiency=0.72, memory_bytes=141 * GB, memory_bw=4.8e12,
        intra_bw=450 * GB * 0.8, inter_bw=50 * GB * 0.8, devices_per_node=8, sms=132, call_latency=NCCL_CALL_LATENCY,
        source="NVIDIA H200 SXM datasheet: 989 TFLOPS dense BF16, 132 SMs (the H100's GH100), 141 GB HBM3e at 4.8 TB/s, NVLink 4 "
               "900 GB/s bidirectional; HGX H200 with 8x 400 Gb/s NICs (50 GB/s per GPU); 80% as NCCL bus "
               "bandwidth"),
    "a100": MachineProfile(
        name="a100", peak_flops=312e12, gemm_efficiency=0.80, memory_bytes=80 * GB, memory_bw=2.04e12,
        intra_bw=300 * GB * 0.8, inter_bw=25 * GB * 0.8, devices_per_node=8, alpha_intra=3e-6, alpha_inter=8e-6,
        sms=108, call_latency=NCCL_CALL_LATENCY,
        source="NVIDIA A100 SXM4 80GB datasheet: 312 TFLOPS dense BF16, 108 SMs, 2.04 TB/s HBM2e, NVLink 3 600 GB/s "
               "bidirectional (300 per direction); DGX A100 8x HDR 200 Gb/s (25 GB/s per GPU); 80% as NCCL "
               "bus bandwidth"),
    "cpu": MachineProfile(
        name="cpu", peak_flops=50e9, gemm_efficiency=0.6, memory_bytes=16 * GB, memory_bw=10 * GB,
        intra_bw=2 * GB, inter_bw=2 * GB, devices_per_node=10**6, alpha_intra=50e-6, alpha_inter=50e-6,
        op_overhead=20e-6, causal=1.0, flash_attention=False, compute_units=2, dtype_bytes=4,
        source="nominal: one x86 core with AVX2 FMA (~50 GFLOP/s fp32), gloo over loopback; run "
               "--machine calibrate for this machine's own numbers"),
}


def named_profile(name: str) -> MachineProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown machine {name!r}; choose one of {', '.join(PROFILES)} or calibrate")
    return PROFILES[name]
