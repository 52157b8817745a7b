"""The Trainer's data path on one rank: read and collate only the rows this rank's stages handle.
(For a dataset with a length index, SFTDataset, indexed_batch.py reads as the launcher does: no gather.)

A stock Trainer gives every rank its own slice of the data; ds_hetero's stages slice the global
batch each by its own dp, so a rank needs in full only the samples of its stage shares (every
language dp rank its micro-batches' samples, every vision dp rank the images it encodes), and of
every other sample only the token ids (the boundary plan and the batch agreement read each
sample's image rows from them). So, per step:

    1. every rank reads and collates (the user's `data_collator`, then `split_collated`) only the
       rows at its needed positions (the data path's `needed_positions()`, step/rank_data.py)
    2. one `all_gather_object` over the boundary group gives every rank every sample's token ids
       from a rank that collated it (every position is some language rank's), with a digest of
       the step's dataset indices: ranks whose samplers disagree raise, all alike
    3. with token-balanced encoders the vision share depends on those token ids: the rows it adds
       are collated then (the data path's `balanced_positions`)

The collator must treat rows independently (TRL's, transformers' padding collators do: padding is
stripped again by the split); `rows_prepared` counts the rows this rank collated.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ...data.agreement import digest
from ...data.samples import as_sample_list


class RankBatch:
    """Turns a global batch of dataset indices into the list `engine.train_batch` takes, on this rank.

    `path` is the engine's `data_path` (step/rank_data.py RankDataPath): this rank's shares, the step's
    plan and the boundary group, nothing else of the engine."""

    def __init__(self, path, dataset, collate: Callable[[list[Any]], Any] | None):
        self.path, self.dataset, self.collate = path, dataset, collate
        self.rows_prepared = 0  # since construction, this rank
        self.steps = 0

    def collate_rows(self, rows: list[Any]) -> list[dict[str, Any]]:
        """Rows -> per-sample dicts: through the collator (then split per sample), else taken as samples."""
        if not rows:
            return []
        if self.collate is None:
            return as_sample_list(rows)
        return self.path.split(self.collate(rows))

    def full_samples(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Every sample of `indices` in full (evaluation: every rank needs all of them)."""
        return self.collate_rows([self.dataset[i] for i in indices])

    def _read(self, indices: Sequence[int], positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        samples = self.collate_rows([self.dataset[indices[p]] for p in positions])
        self.rows_prepared += len(positions)
        return dict(zip(positions, samples))

    def build(self, indices: Sequence[int], step: int | None = None) -> list[dict[str, Any]]:
        """The step's batch (`step` unused: the rows are read at the step, from the indices given)."""
        path = self.path
        indices = [int(i) for i in indices]
        error = None
        try:  # a collator error must reach every rank, not leave the others waiting in the gather
            full = self._read(indices, sorted(path.needed_positions(cover=True)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            full, error = {}, f"{type(exc).__name__}: {exc}"
        mine = {p: s["input_ids"].reshape(-1).tolist() for p, s in full.items() if "input_ids" in s}
        gathered: list[Any] = [None] * dist.get_world_size(path.boundary_group)
        dist.all_gather_object(gathered, (digest(indices), mine, error), group=path.boundary_group)
        errors = [(r, e) for r, (_, _, e) in enumerate(gathered) if e is not None]
        if errors:
            rank, first = errors[0]
            global_rank = dist.get_global_rank(path.boundary_group, rank)
            raise ValueError(f"preparing the global batch failed on rank {global_rank} (ranks failing: "
                             f"{len(errors)}): {first}")
        if len({d for d, _, _ in gathered}) > 1:
            raise ValueError(
                "the ranks drew different global batches from the sampler (its order must be the same on every "
                "rank: seed it, or use the default sampler, which ds_hetero seeds with data_seed / seed)")
        ids: dict[int, list[int]] = {}
        for _, part, _ in gathered:
            for p, tokens in part.items():
                ids.setdefault(p, tokens)
        batch: list[dict[str, Any]] = []
        for p in range(len(indices)):
            if p in full:
                batch.append(full[p])
            elif p in ids:
                batch.append({"input_ids": torch.tensor(ids[p], dtype=torch.long), "light": True})
            else:  # a row no rank could collate: its owner's error is raised by the batch agreement
                batch.append({"input_ids": torch.zeros(0, dtype=torch.long), "light": True})
        plan = path.plan_of(batch)  # a malformed batch: None, and the batch agreement refuses it
        if plan is not None:
            extra = sorted(p for p in path.balanced_positions(plan) if p not in full)
            for p, sample in self._read(indices, extra).items():
                batch[p] = sample
        self.steps += 1
        return batch
