"""Progress of a training loop on rank 0: a tqdm bar on a terminal, plain lines otherwise.

Under a log file or a pipe a tqdm bar rewrites itself with carriage returns, which the file keeps:
100 steps became one 23 KB line. Without a terminal this prints one line every `every` steps
(and the last), each readable alone:

    step 10/100  loss 4.1234  grad norm 2.41  step 2.75 s  1,234 tokens/s  data wait 0.005 s  bubble 7.0 %
"""

from __future__ import annotations

import sys
from typing import IO

from ..result import StepResult


def default_every(total: int) -> int:
    """About 20 lines for a run, never fewer than one step apart."""
    return max(1, total // 20)


def step_text(step: int, total: int, r: StepResult) -> str:
    """One step's figures, with units (step is 1-based)."""
    return (f"step {step}/{total}  loss {r.loss:.4f}  grad norm {r.grad_norm:.2f}  step {r.step_time:.2f} s  "
            f"{r.num_tokens / r.step_time if r.step_time > 0 else 0:,.0f} tokens/s  data wait {r.data_wait:.3f} s  "
            f"bubble {100 * r.bubble_fraction:.1f} %" + _rate(r))


def _rate(r: StepResult) -> str:
    """The step's TFLOP/s per device (whole model) and MFU, where it has them (throughput/meter.py)."""
    tflops, mfu = r.throughput.get("tflops_per_device/model"), r.throughput.get("mfu/model")
    if tflops is None:
        return ""
    return f"  {tflops:.3g} TFLOP/s per device" + (f" (MFU {100 * mfu:.1f} %)" if mfu is not None else "")


class Progress:
    """`update(result)` after every step, `close()` at the end; prints nothing when not `enabled`
    (every rank but the one that reports)."""

    def __init__(self, total: int, enabled: bool = True, every: int | None = None, stream: IO[str] | None = None,
                 first_step: int = 0):
        self.total, self.enabled, self.step = total, enabled, first_step
        self.stream = stream or sys.stdout
        self.every = every or default_every(total)
        self.bar = None
        if enabled and self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=first_step, desc="train", file=self.stream, dynamic_ncols=True)

    def update(self, r: StepResult) -> None:
        self.step += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{r.loss:.3f}", tok_s=f"{r.num_tokens / r.step_time:.0f}",
                                 step_s=f"{r.step_time:.3f}", data_s=f"{r.data_wait:.3f}",
                                 bubble=f"{r.bubble_fraction:.2f}",
                                 **({"tflops": f"{r.throughput['tflops_per_device/model']:.3g}"}
                                    if "tflops_per_device/model" in r.throughput else {}))
            self.bar.update()
        elif self.step % self.every == 0 or self.step == self.total or self.step == 1:
            print(step_text(self.step, self.total, r), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
