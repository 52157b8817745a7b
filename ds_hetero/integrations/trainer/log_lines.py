"""The Trainer's printed log under ds_hetero: one line of named numbers per log, the layout line first.

The stock PrinterCallback (`disable_tqdm`) and ProgressCallback print each log as a dict of strings
(`{'loss': '5.546', 'hetero/vision/forward_s': '0.1818', ...}`: 19 keys with ds_hetero's figures).
Here each log prints as one line, figures named with their units:

    step 5: loss 4.6531  grad norm 2.51  lr 0.002  epoch 0.02  step 1.10 s  114 tokens/s  data wait 0.004 s
            bubble 12.9 %  boundary 64.0 KiB/step (lower bound 64.0 KiB)

Only what is printed changes: `state.log_history` and the `report_to` trackers keep every key as a
number (the per-stage phase times `hetero/<stage>/<phase>_s` and the language token figures too, which
the line leaves out; docs/timeline.md). Other keys (eval_loss, train_runtime, ...) print as `name value`.
"""

from __future__ import annotations

from typing import Any, Callable

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

# key -> its printed text (in this order), from the value
NAMED: dict[str, Callable[[float], str]] = {
    "loss": lambda v: f"loss {v:.4f}",
    "grad_norm": lambda v: f"grad norm {v:.3g}",
    "learning_rate": lambda v: f"lr {v:.3g}",
    "epoch": lambda v: f"epoch {v:.3g}",
    "hetero/step_s": lambda v: f"step {v:.2f} s",
    "hetero/tokens_per_s": lambda v: f"{v:,.0f} tokens/s",
    "hetero/data_wait_s": lambda v: f"data wait {v:.3f} s",
    "hetero/bubble_fraction": lambda v: f"bubble {100 * v:.1f} %",
}
# in the logs, not in the line: per-phase times and the language stage's token figures
QUIET_PREFIXES = ("hetero/language_", "hetero/boundary_")
LEFT_OUT = ("total_flos",)


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def log_line(logs: dict[str, Any], step: int) -> str:
    parts = [NAMED[k](logs[k]) for k in NAMED if isinstance(logs.get(k), (int, float))]
    if "hetero/boundary_bytes" in logs:
        parts.append(f"boundary {_kib(logs['hetero/boundary_bytes'])}/step (lower bound "
                     f"{_kib(logs.get('hetero/boundary_lower_bound_bytes', 0))})")
    for key, value in logs.items():
        if key in NAMED or key in LEFT_OUT or key.startswith(QUIET_PREFIXES):
            continue
        if key.startswith("hetero/") and key.endswith("_s") and key.count("/") == 2:  # hetero/<stage>/<phase>_s
            continue
        parts.append(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}")
    return f"step {step}: " + "  ".join(parts)


class _Layout:
    """The layout line once, before the first log line (the engine exists by then)."""

    def __init__(self, layout: Callable[[], str | None]):
        self.layout, self.shown = layout, False

    def first(self) -> str | None:
        if self.shown:
            return None
        line = self.layout()
        self.shown = line is not None  # no engine yet (an evaluate() before train()): the next log shows it
        return line


class HeteroPrinter(TrainerCallback):
    """In place of PrinterCallback (`disable_tqdm=True`, and what a log file gets)."""

    def __init__(self, layout: Callable[[], str | None]):
        self.layout = _Layout(layout)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero and state.is_world_process_zero and logs:
            line = self.layout.first()
            if line:
                print(line, flush=True)
            print(log_line(logs, state.global_step), flush=True)


class HeteroProgress(ProgressCallback):
    """ProgressCallback's bar, its log lines written as HeteroPrinter's."""

    def __init__(self, layout: Callable[[], str | None], **kwargs):
        super().__init__(**kwargs)
        self.layout = _Layout(layout)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            line = self.layout.first()
            if line:
                self.training_bar.write(line)
            self.training_bar.write(log_line(logs, state.global_step))


def swap_printers(trainer, layout: Callable[[], str | None]) -> None:
    """Replace the Trainer's stock log printer (whichever it has) by ours; other callbacks stay."""
    handler = trainer.callback_handler
    for callback in list(handler.callbacks):
        if type(callback) is PrinterCallback:
            handler.remove_callback(callback)
            handler.add_callback(HeteroPrinter(layout))
        elif type(callback) is ProgressCallback:
            handler.remove_callback(callback)
            handler.add_callback(HeteroProgress(layout))
