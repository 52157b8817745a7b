"""Dominance pruning of the memory features: a candidate with recompute or a per-stage ZeRO 3 is
skipped when the same candidate without that one feature fits and is runnable.

Why this is safe: in the cost model each of these features only trades time for memory. Recompute
adds a forward (and its tp / cp collectives) to the backward; a stage's ZeRO 3 instead of the
config's ZeRO 1 or 2 adds parameter gathers per micro-batch and keeps the optimizer's work
(memory.state_elements partitions the master weights and moments alike). So the sibling without
the feature is at least as fast; if it fits the memory and the engine runs it, the candidate with
the feature can never be the pick, nor either baseline (which take the fastest fitting of their
kind, and the sibling is of the same kind). When the sibling is modelled only, the candidate is
still priced: it may be the runnable one.
"""

from __future__ import annotations

from dataclasses import replace

from .candidate import Candidate


def lighter_siblings(cand: Candidate) -> list[Candidate]:
    """The candidate with one memory feature turned off, for each feature it uses."""
    out = []
    for attr in ("vision", "language"):
        stage = getattr(cand, attr)
        if stage.recompute:
            out.append(replace(cand, **{attr: replace(stage, recompute=False)}))
    if cand.vision.recompute and cand.language.recompute:  # Megatron's candidates switch both together
        out.append(replace(cand, vision=replace(cand.vision, recompute=False),
                           language=replace(cand.language, recompute=False)))
    if cand.language.zero is not None:  # a per-stage ZeRO: both stages back on the config's stage
        out.append(replace(cand, vision=replace(cand.vision, zero=None), language=replace(cand.language, zero=None)))
    return out


class Dominance:
    """Remembers which priced candidates fit and run; `dominated(c)` when a lighter sibling did.

    siblings   the candidate's lighter siblings (`lighter_siblings`; multi_candidate.py's for several encoders)
    """

    def __init__(self, siblings=lighter_siblings):
        self.siblings = siblings
        self.fits_and_runs: set = set()

    def record(self, pred) -> None:
        if pred.fits and pred.runnable:
            self.fits_and_runs.add(pred.candidate)

    def dominated(self, cand: Candidate) -> bool:
        return any(s in self.fits_and_runs for s in self.siblings(cand))

    def skip(self, cand) -> bool:
        """`dominated(c)`, remembering a dominated candidate as covered so that its own heavier
        siblings are skipped too (a feature only slows a candidate down: something that fits, runs
        and is at least as fast stands behind each of them)."""
        if self.dominated(cand):
            self.fits_and_runs.add(cand)
            return True
        return False
