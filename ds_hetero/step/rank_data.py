"""What a data path needs to know of this rank: which samples of a global batch it reads in full, and the
step's plan. The engine's loader and the Trainer's data path (integrations/trainer/rank_batch.py) both take
this object, not the engine.

A rank needs in full only the samples of its stage shares (every language dp rank its micro-batches'
samples, every encoder dp rank the items it encodes); of every other sample only the token ids (the plan
reads each sample's item rows from them). Shares by position are known before the batch; an encoder
balanced by "tokens" takes items that depend on the batch's token ids, known once the plan is, and so
does the language stage with packed batching (step/packing.py), and with it every encoder stage: a
packed micro-batch is any set of samples, and an encoder pass covers those of the micro-batches it
feeds, so even an encoder by position encodes samples known only from the token ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..config import HeteroConfig
from ..data.samples import split_collated
from .shares import stage_samples
from .step_plan import StepPlan


@dataclass(frozen=True)
class HeldShare:
    """One stage this rank holds, as the data path sees it: its name, dp coordinate and passes per step."""

    stage: str
    dp: int
    passes: int


class RankDataPath:
    """This rank's view of each global batch; `boundary_group` spans every stage (the batch's agreement)."""

    def __init__(self, config: HeteroConfig, adapter, held: Sequence[HeldShare], boundary_group):
        self.config, self.adapter, self.held, self.boundary_group = config, adapter, tuple(held), boundary_group

    def needed_positions(self, cover: bool = False) -> set[int]:
        """Global-batch positions whose full sample this rank reads, known before the batch is:
        its language shares, and its encoders' shares where they go by position. With balance
        "tokens" an encoder's share depends on the batch's token ids (`balanced_positions`), and so
        do the language stage's and every encoder's with packed batching. `cover`: the language shares by position
        even then (the Trainer's data path learns every sample's token ids from the ranks that
        collated it, so every position must be some language rank's; integrations/trainer/
        rank_batch.py)."""
        needed: set[int] = set()
        language = self.config.language.name
        for share in self.held:
            if share.stage != language and self._by_plan(share.stage):
                continue
            if share.stage == language and self.config.packed and not cover:
                continue
            for m in range(share.passes):
                needed.update(stage_samples(self.config, share.stage, share.dp, m))
        return needed

    def balanced_positions(self, plan: StepPlan) -> set[int]:
        """Positions of the samples whose items this rank's token-balanced encoder stages (every
        encoder stage with packed batching) encode this step, and its packed language shares: known only once the batch's token ids are (the
        rest of `needed_positions`)."""
        language = self.config.language.name
        out = {p for share in self.held if share.stage != language and self._by_plan(share.stage)
               for p in plan.encoder_positions(share.stage, share.dp)}
        for share in self.held:
            if share.stage == language and self.config.packed:
                out |= plan.language_positions(share.dp)
        return out

    def read_positions(self, plan: StepPlan | None) -> set[int]:
        """Every position this rank reads in full in a step: `needed_positions` and, with the step's plan,
        `balanced_positions` (None, a malformed batch: the batch agreement refuses it)."""
        needed = self.needed_positions()
        return needed | self.balanced_positions(plan) if plan is not None else needed

    def _by_plan(self, stage: str) -> bool:
        """Whether encoder `stage`'s samples are known only from the plan (not by position)."""
        return self.config.packed or self.config.balance_of(stage) == "tokens"

    def plan_of(self, samples: Sequence[dict[str, Any]]) -> StepPlan | None:
        """The step's plan; None for a malformed batch (the batch agreement then refuses it on every rank)."""
        try:
            return StepPlan(self.config, self.adapter.encoders(), samples, language_cost=self.adapter.language_cost,
                            dense_attention=self.adapter.dense_rows(self.config.packed_attention))
        except (ValueError, KeyError, TypeError, AttributeError, RuntimeError):  # RuntimeError: torch's
            return None

    def split(self, batch) -> list[dict[str, Any]]:
        """A collated batch -> per-sample dicts (data/samples.py split_collated, by this model's items)."""
        return split_collated(batch, self.adapter)
