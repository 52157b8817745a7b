"""Measured trials: run the top K runnable candidates for a few steps and re-rank them by step time.

Like DeepSpeed's autotuner, the cost model proposes and a short measurement decides. The planner
only chooses what to try and ranks what was measured; running a candidate needs the engine, so
the runtime hands the planner a runner (ds_hetero/trial_runner.py), one per entry point:

`ds-hetero plan --trial K` (`launch_trials` with `launch`, trial_runner.launch_one): each
candidate is one launch of the `deepspeed` launcher on this machine running
ds_hetero/trial_worker.py, which reports the median step time after the first (the slowest
rank's, each step). Separate launches isolate the candidates (a crash or an out-of-memory fails
one trial, which is then ranked last, not the plan) and every launch starts from the same state.
With `rounds` > 1 the candidates run round-robin (A B A B ...), so drift on a shared machine hits
them alike; the median over rounds ranks them.

`"hetero_parallel": {"auto": true, "trial": K}` (auto.py with `run_trials`,
trial_runner.trials_in_process): the processes already exist (the user's launcher), so the
trials run inside them: rank 0 plans and broadcasts the K configs, then every rank builds each
candidate's engine on a deep copy of the model and the step times are max-reduced over the
world, so every rank ranks the trials identically with no further broadcast.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .cost import Prediction

# (model source, DeepSpeed config, world size, seq_len, image tokens, steps, work directory, tag)
#   -> (median step seconds, error text or ""): one candidate measured in its own launch
Launch = Callable[[str, Mapping[str, Any], int, int, int, int, str, str], tuple[float, str]]

# (model, DeepSpeed configs, samples, steps) -> median step seconds of each config, the same on every rank
RunTrials = Callable[[Any, Sequence[Mapping[str, Any]], Sequence[dict], int], list[float]]


@dataclass(frozen=True)
class Trial:
    prediction: Prediction
    measured_s: float  # median step time; inf when the trial failed
    rounds: tuple[float, ...] = ()
    error: str = ""


def top_runnable(plan, k: int) -> list[Prediction]:
    """The K best fitting runnable candidates (the planner's order)."""
    return [p for p in plan.runnable if p.fits][:k]


def launch_trials(model: str, plan, k: int, world: int, launch: Launch, steps: int = 3, rounds: int = 1,
                  log: Callable[[str], None] = print) -> list[Trial]:
    """Run the top K runnable candidates of `plan`, each through `launch`; best measured first."""
    if steps < 2:
        raise ValueError("--trial-steps must be at least 2 (the first step is not timed)")
    preds = top_runnable(plan, k)
    if not preds:
        raise ValueError("no fitting runnable candidate to try")
    wl = plan.workload
    times: dict[int, list[float]] = {i: [] for i in range(len(preds))}
    errors: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="ds_hetero_trial_") as workdir:
        for r in range(rounds):
            for i, p in enumerate(preds):
                if i in errors:
                    continue
                t0 = time.perf_counter()
                step, err = launch(model, plan.ds_config(p), world, wl.seq_len, wl.image_tokens, steps, workdir,
                                   f"trial{i}_{r}")
                log(f"trial {i + 1}/{len(preds)} round {r + 1}: {p.candidate.label()}: "
                    + (f"{step:.4f} s/step" if not err else f"FAILED ({err.splitlines()[-1] if err else ''})")
                    + f" [{time.perf_counter() - t0:.0f} s]")
                if err:
                    errors[i] = err
                else:
                    times[i].append(step)
    trials = [Trial(p, statistics.median(times[i]) if times[i] and i not in errors else float("inf"),
                    tuple(times[i]), errors.get(i, "")) for i, p in enumerate(preds)]
    return sorted(trials, key=lambda t: t.measured_s)


def trial_table(trials: Sequence[Trial]) -> str:
    pred_order = sorted(trials, key=lambda t: t.prediction.step_s)
    lines = ["measured trials (re-ranked by measured step time; the first is the pick):",
             f"{'#':>3} {'layout':<46} {'predicted':>10} {'measured':>10} {'pred #':>6}"]
    for i, t in enumerate(trials, 1):
        m = f"{t.measured_s:.4f} s" if t.measured_s != float("inf") else "failed"
        lines.append(f"{i:>3} {t.prediction.candidate.label():<46} {t.prediction.step_s:>9.4f}s {m:>10} "
                     f"{pred_order.index(t) + 1:>6}")
    return "\n".join(lines)
