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
    """The candidate with one memory feature turned off, for each feature it uses: a stage's
    recompute; every stage's at once when several recompute (Megatron's candidates switch them
    together); a per-stage ZeRO (every stage back on the config's)."""
    def with_stages(encoders, language):
        return replace(cand, encoders=tuple(encoders), language=language)

    out, lang = [], cand.language
    for name, s in cand.encoders:
        if s.recompute:
            out.append(with_stages(((n, replace(e, recompute=False) if n == name else e) for n, e in cand.encoders),
                                   lang))
    if lang.recompute:
        out.append(replace(cand, language=replace(lang, recompute=False)))
    if sum(s.recompute for s in (*dict(cand.encoders).values(), lang)) > 1:
        out.append(with_stages(((n, replace(e, recompute=False)) for n, e in cand.encoders),
                               replace(lang, recompute=False)))
    if lang.zero is not None or any(s.zero is not None for _, s in cand.encoders):
        out.append(with_stages(((n, replace(e, zero=None)) for n, e in cand.encoders), replace(lang, zero=None)))
    return out


class Dominance:
    """Remembers which priced candidates fit and run; `dominated(c)` when a lighter sibling did."""

    def __init__(self):
        self.fits_and_runs: set = set()

    def record(self, pred) -> None:
        if pred.fits and pred.runnable:
            self.fits_and_runs.add(pred.candidate)

    def dominated(self, cand: Candidate) -> bool:
        return any(s in self.fits_and_runs for s in lighter_siblings(cand))

    def skip(self, cand) -> bool:
        """`dominated(c)`, remembering a dominated candidate as covered so that its own heavier
        siblings are skipped too (a feature only slows a candidate down: something that fits, runs
        and is at least as fast stands behind each of them)."""
        if self.dominated(cand):
            self.fits_and_runs.add(cand)
            return True
        return False
