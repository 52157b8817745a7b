"""Whether the engine runs a candidate: its config through `check_candidate` (the checks of
`ds-hetero validate` and `initialize`), remembered per candidate while one plan is searched.

The extended candidates (a language pipeline, first_stage, recompute, per-stage ZeRO) are generated
by the cost model's own enumeration (modelled.py); each is runnable exactly when these checks accept
its config, so a rule the engine gains or drops (cp with a pipeline, ZeRO 3 with a pipeline, tied
embeddings with a pipeline) moves rows between runnable and modelled with no change here.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import HeteroConfigError
from .candidate import Candidate
from .validity import check_candidate


class EngineVerdicts:
    """`accepts(candidate)`: True when the engine's checks accept its config for this world."""

    def __init__(self, base: Mapping[str, Any], world: int, adapter, client_opt: bool = False):
        self.base, self.world, self.adapter, self.client_opt = base, world, adapter, client_opt
        self.layouts: dict = {}  # the model checks' verdicts (validity.check_candidate's cache)
        self.seen: dict[Candidate, bool] = {}
        self.reasons: dict[str, int] = {}  # field named by each refusal -> count

    def accepts(self, cand: Candidate) -> bool:
        if cand not in self.seen:
            try:
                check_candidate(cand.ds_config(self.base), self.world, self.adapter, self.client_opt, self.layouts)
                self.seen[cand] = True
            except HeteroConfigError as exc:
                self.reasons[exc.field] = self.reasons.get(exc.field, 0) + 1
                self.seen[cand] = False
        return self.seen[cand]
