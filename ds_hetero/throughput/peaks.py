"""The peak FLOP/s a device can do, against which MFU is read.

GPUs: the dense (no sparsity) tensor-core peak of NVIDIA's datasheets, by the CUDA device name and
the dtype the engines compute in. "fp32" is the plain FP32 peak: an fp32 run whose GEMMs use TF32
(`torch.backends.cuda.matmul.allow_tf32`) reaches beyond it, and its MFU then reads above what the
tensor cores allow; say so where it matters. CPU: no datasheet applies, so the peak is measured
once (a large GEMM in the dtype on this rank's threads) and cached beside the planner's calibration
(~/.cache/ds_hetero, DS_HETERO_CACHE overrides).
"""

from __future__ import annotations

import json
import os
import socket

# TFLOP/s, dense. Sources (NVIDIA datasheets): H100 SXM5 989.4 BF16, 66.9 FP32 (PCIe 756 / 51.2);
# H200 SXM 989.4 / 66.9 (NVL 835 / 60); A100 SXM4 and PCIe 312 / 19.5; HGX B200 18 PF dense BF16 and
# 600 TF FP32 for 8 GPUs (2250 / 75 per GPU); GB200 NVL72 180 PF dense BF16 and 5760 TF FP32 for 72
# GPUs (2500 / 80 per GPU).
GPU_PEAKS_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    # matched in order: the more specific names first
    ("GB200", {"bf16": 2500.0, "fp32": 80.0}),
    ("B200", {"bf16": 2250.0, "fp32": 75.0}),
    ("H200 NVL", {"bf16": 835.0, "fp32": 60.0}),
    ("H200", {"bf16": 989.4, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp32": 19.5}),
)


def dtype_key(dtype) -> str:
    """"bf16" for bf16 and fp16 (the same tensor-core peak on these parts), else "fp32"."""
    name = str(dtype)
    return "bf16" if ("bfloat16" in name or "float16" in name) else "fp32"


def gpu_peak(device_name: str, dtype) -> float | None:
    """FLOP/s of the named CUDA device at `dtype`, or None for a device not in the table."""
    for key, peaks in GPU_PEAKS_TFLOPS:
        if key.lower() in device_name.lower():
            return peaks[dtype_key(dtype)] * 1e12
    return None


def _cache_path(dtype, threads: int) -> str:
    root = os.environ.get("DS_HETERO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ds_hetero"))
    return os.path.join(root, f"gemm-peak-{socket.gethostname()}-{dtype_key(dtype)}-{threads}threads.json")


def measured_cpu_peak(dtype, size: int = 1024) -> float:
    """FLOP/s of a size^3 GEMM on this process's threads (planner/calibrate.py's timing: the median of
    5 after a warm-up), measured once and cached."""
    import torch

    from ..planner.calibrate import gemm_seconds

    threads = torch.get_num_threads()
    path = _cache_path(dtype, threads)
    try:
        with open(path) as f:
            return float(json.load(f)["flops_per_s"])
    except (OSError, ValueError, KeyError):
        pass
    work = torch.float32 if dtype_key(dtype) == "fp32" else torch.bfloat16
    peak = 2.0 * size**3 / gemm_seconds(size, size, size, "cpu", work)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"flops_per_s": peak, "size": size, "threads": threads}, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return peak


def device_peak(device, dtype) -> tuple[float | None, str]:
    """(peak FLOP/s, where it comes from) of `device` (a torch.device) at `dtype`."""
    if device.type == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
        peak = gpu_peak(name, dtype)
        return peak, (f"{name} datasheet, dense {dtype_key(dtype)}" if peak else f"{name}: not in the peak table")
    if device.type == "cpu":
        return measured_cpu_peak(dtype), f"measured {dtype_key(dtype)} GEMM on this CPU (cached)"
    return None, f"{device.type}: no peak known"
