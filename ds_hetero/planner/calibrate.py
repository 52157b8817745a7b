"""Measure this machine: GEMM rate at the model's shapes, memory bandwidth, collective timings.

    profile = machine_profile("calibrate", shapes=[(m, k, n), ...])   # cached after the first run

What is measured (well under a minute on a quiet machine):
- GEMMs: the given [m,k]x[k,n] shapes (the planner passes the model's own), one thread per
  process like the training ranks, fitted as t = overhead + 2mkn / rate; and the rate against
  the GEMM's smallest dimension (`CURVE_DIMS`, the other two 512): the profile's `gemm_curve`,
  so that a narrow GEMM (a small tower's 1152 / tp columns, a head's 64-wide products) is priced
  at the rate this machine reaches on that shape, not at the large GEMMs' rate;
- the overhead of one operator call (tiny tensors, autograd recording);
- memory bandwidth: a large tensor copy (one thread, as a rank);
- on the CPU, the cost of first touching memory (a fresh large tensor filled, against one reused);
- all_reduce, all_gather and all_to_all over groups of 2 (all pairs at once) and `world` ranks,
  three sizes each,
  with the current backend (gloo on CPU, NCCL on GPUs), in freshly spawned local processes,
  fitted per (collective, group size) as t = a + b bytes. gloo has no reduce_scatter; it is
  taken as half an all_reduce (a ring all-reduce is a reduce-scatter plus an all-gather).

The result is cached as JSON under ~/.cache/ds_hetero/ (DS_HETERO_CACHE overrides), keyed by
host name, backend, device count and torch version; `refresh=True` measures again.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import tempfile
import time
from dataclasses import asdict
from typing import Iterator

from .machine import PROFILES, MachineProfile, named_profile

SIZES = (4 * 1024, 256 * 1024, 4 * 1024 * 1024)  # bytes per collective
KINDS = ("all_reduce", "all_gather", "all_to_all")
DEFAULT_SHAPES = ((256, 256, 256), (1024, 256, 768), (2048, 512, 512), (4096, 256, 1024), (64, 64, 64))
CURVE_DIMS = (8, 16, 32, 64, 128, 256, 512)  # the smallest dimension of the measured curve's GEMMs
CURVE_OTHER = 512  # the other two dimensions


def cache_path(backend: str, devices: int) -> str:
    import torch

    root = os.environ.get("DS_HETERO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ds_hetero"))
    key = f"{socket.gethostname()}-{backend}-{devices}-torch{torch.__version__}".replace("/", "_").replace("+", "_")
    return os.path.join(root, f"calibration-{key}.json")


def _backend() -> tuple[str, int]:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        return "nccl", torch.cuda.device_count()
    return "gloo", 4


def _timed(fn, reps: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (a, b) of t = a + b x, both clamped to >= 0."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    b = max(0.0, sum((x - mx) * (y - my) for x, y in points) / var) if var else 0.0
    return max(0.0, my - b * mx), b


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread for the block (a GEMM rate per core, as the cost model prices a rank)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def gemm_seconds(m: int, k: int, n: int, device: str = "cpu", dtype=None) -> float:
    """Median seconds of one [m, k] x [k, n] GEMM on `device` in `dtype` (default fp32 on the CPU,
    bf16 elsewhere), on the calling threads."""
    import torch

    dtype = dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)

    def run():
        torch.mm(a, b)
        if device != "cpu":
            torch.cuda.synchronize()

    return _timed(run)


def measure_gemms(shapes, device: str = "cpu") -> tuple[float, float]:
    """(overhead s, FLOP/s) fitted over the shapes."""
    with _one_thread():
        points = [(2.0 * m * k * n, gemm_seconds(m, k, n, device)) for m, k, n in shapes]
    overhead, per_flop = _fit(points)
    return overhead, 1.0 / per_flop if per_flop else max(f / t for f, t in points)


def measure_gemm_curve(device: str = "cpu", dims=CURVE_DIMS) -> tuple[tuple[int, float], ...]:
    """((d, FLOP/s), ...): one thread's rate on [512, d] x [d, 512], [d, 512] x [512, 512] and
    [512, 512] x [512, d] (the median of the three), ascending in d, never above a larger d's."""
    big, curve = CURVE_OTHER, []
    with _one_thread():
        for d in dims:
            rates = [2.0 * m * k * n / gemm_seconds(m, k, n, device)
                     for m, k, n in ((big, d, big), (d, big, big), (big, big, d))]
            curve.append((d, statistics.median(rates)))
    # noise on a shared machine can make a narrow GEMM measure faster than a wider one: keep it monotone
    for i in range(len(curve) - 2, -1, -1):
        curve[i] = (curve[i][0], min(curve[i][1], curve[i + 1][1]))
    return tuple(curve)


def measure_op_overhead(device: str = "cpu", ops: int = 200) -> float:
    """Seconds per operator call on tiny tensors with autograd recording (forward only): what every
    element-wise op and small kernel of a layer costs beyond its arithmetic."""
    import torch

    x = torch.ones(8, device=device, requires_grad=True)

    def run():
        y = x
        for _ in range(ops):
            y = y * 1.0001
        if device != "cpu":
            torch.cuda.synchronize()

    return _timed(run) / ops


def measure_memory_bw(device: str = "cpu") -> float:
    import torch

    x = torch.empty(16 * 2**20, dtype=torch.float32, device=device)  # 64 MiB
    y = torch.empty_like(x)

    def run():
        y.copy_(x)
        if device != "cpu":
            torch.cuda.synchronize()

    return 2 * x.numel() * 4 / _timed(run)


def measure_first_touch(nbytes: int = 256 * 2**20) -> float:
    """Seconds per byte of filling memory just allocated beyond filling memory already touched: a CPU
    tensor this large is mapped fresh by the C library, and each of its pages faults once."""
    import torch

    held = torch.empty(nbytes // 4, dtype=torch.float32)
    held.fill_(1.0)
    reuse = _timed(lambda: held.fill_(2.0))
    fresh = _timed(lambda: torch.empty(nbytes // 4, dtype=torch.float32).fill_(2.0))
    return max(0.0, fresh - reuse) / nbytes


def _collective_worker(rank: int, world: int, backend: str, store: str, out: str) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's rename
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    results = {}
    sizes = sorted({2, world})
    # Every rank is in one group of each size, and the groups of a size run at the same time, as
    # the tp (or dp) groups of a layout do: on shared cores they contend, and the fit includes it.
    groups = {}
    for n in sizes:
        made = [dist.new_group(list(range(i, i + n))) for i in range(0, world - world % n, n)] if n < world else [None]
        groups[n] = made[rank // n] if rank // n < len(made) else False
    for n in sizes:
        group = groups[n]
        if group is False:  # a rank left over when n does not divide the world: join the barriers only
            for _ in range(len(KINDS) * len(SIZES)):
                dist.barrier()
            continue
        for kind in KINDS:
            pts = []
            for nbytes in SIZES:
                numel = max(n, nbytes // 4 // n * n)
                x = torch.randn(numel, device=device)
                if kind == "all_reduce":
                    def run():
                        dist.all_reduce(x, group=group)
                elif kind == "all_gather":
                    part = x[: numel // n].clone()

                    def run():
                        dist.all_gather_into_tensor(x, part, group=group)
                else:
                    y = torch.empty_like(x)

                    def run():
                        dist.all_to_all_single(y, x, group=group)

                def synced():
                    run()
                    if backend == "nccl":
                        torch.cuda.synchronize()
                dist.barrier()
                pts.append((numel * 4, _timed(synced, reps=3)))
            results[f"{kind}/{n}"] = pts
    dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def measure_collectives(backend: str, world: int, timeout_s: float = 180.0):
    """{collective: {group size: (a, b)}}"""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ds_hetero_calibrate_") as tmp:
        out = os.path.join(tmp, "out.json")
        procs = [ctx.Process(target=_collective_worker, args=(r, world, backend, os.path.join(tmp, "store"), out),
                             daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if any(p.exitcode != 0 for p in procs) or not os.path.exists(out):
            raise RuntimeError(f"calibration of {backend} collectives failed (exit codes {[p.exitcode for p in procs]})")
        with open(out) as f:
            raw = json.load(f)
    fits: dict[str, dict[int, tuple[float, float]]] = {}
    for key, pts in raw.items():
        kind, n = key.split("/")
        fits.setdefault(kind, {})[int(n)] = _fit([tuple(p) for p in pts])
    if "all_reduce" in fits:  # a ring all-reduce = reduce-scatter + all-gather
        fits["reduce_scatter"] = {n: (a / 2, b / 2) for n, (a, b) in fits["all_reduce"].items()}
    return fits


def calibrate(shapes=None, world: int | None = None) -> MachineProfile:
    backend, devices = _backend()
    world = world or devices
    device = "cuda" if backend == "nccl" else "cpu"
    _, rate = measure_gemms(shapes or DEFAULT_SHAPES, device)
    curve = measure_gemm_curve(device)
    # the fitted rate is the large GEMMs': the curve's widest point never exceeds it
    curve = tuple((d, min(r, rate)) for d, r in curve)
    op = measure_op_overhead(device)
    with _one_thread():  # one thread per rank, as the GEMMs
        bw = measure_memory_bw(device)
        touch = measure_first_touch() if device == "cpu" else 0.0
    fits = measure_collectives(backend, world)
    base = PROFILES["cpu"] if backend == "gloo" else PROFILES["h100"]
    return base.with_calibration(
        name=f"calibrated {backend}", peak_flops=rate, gemm_efficiency=1.0, memory_bw=bw, gemm_fit=(op, rate),
        gemm_curve=curve, collectives=fits, op_overhead=op, first_touch=touch,
        heap_keeps_activations=device == "cpu",
        compute_units=len(os.sched_getaffinity(0)) if backend == "gloo" else 0,
        source=f"measured on {socket.gethostname()} ({backend}, {world} ranks) at {time.strftime('%Y-%m-%d %H:%M')}",
    )


def _to_json(profile: MachineProfile) -> dict:
    d = asdict(profile)
    d["collectives"] = {k: {str(n): list(v) for n, v in fits.items()} for k, fits in profile.collectives.items()}
    return d


def _from_json(d: dict) -> MachineProfile:
    d = dict(d)
    d["collectives"] = {k: {int(n): tuple(v) for n, v in fits.items()} for k, fits in d["collectives"].items()}
    d["gemm_fit"] = tuple(d["gemm_fit"]) if d.get("gemm_fit") else None
    d["gemm_curve"] = tuple((int(dim), float(r)) for dim, r in d.get("gemm_curve") or ())  # absent in older caches
    return MachineProfile(**d)


def machine_profile(name: str, shapes=None, refresh: bool = False, log=None) -> MachineProfile:
    """A named profile (h100, h200, a100, cpu) or `calibrate`: this machine, measured once and cached."""
    if name != "calibrate":
        profile = named_profile(name)
        if name == "cpu":  # ranks share this machine's cores
            profile = profile.with_calibration(compute_units=len(os.sched_getaffinity(0)))
        return profile
    backend, devices = _backend()
    path = cache_path(backend, devices)
    if not refresh and os.path.exists(path):
        with open(path) as f:
            return _from_json(json.load(f))
    t0 = time.perf_counter()
    profile = calibrate(shapes)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(_to_json(profile), f, indent=1)
    if log:
        log(f"calibrated in {time.perf_counter() - t0:.0f} s, cached at {path}")
    return profile
