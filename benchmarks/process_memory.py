"""This process's resident memory on Linux, for the benchmarks that measure it on CPU ranks: the kernel's
counters in /proc/self/status (VmRSS, the resident set; VmHWM, its high-water mark) and the reset of
the high-water mark through /proc/self/clear_refs, so a phase's peak can be read alone."""

from __future__ import annotations

import gc


def status_kib(key: str) -> int:
    """A /proc/self/status counter in KiB (VmRSS, VmHWM, ...)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} missing from /proc/self/status")


def reset_peak() -> None:
    """VmHWM := VmRSS (Linux >= 4.0), after collecting what Python still holds."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
