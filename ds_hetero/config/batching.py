"""`hetero_parallel.language_batching` and `max_tokens_per_micro_batch`: how the language stage
cuts its micro-batches (docs/packing.md). Pure: every rank raises the same error.

    "samples"  each language dp rank takes the d-th contiguous share of a micro-batch, padded to
               its longest sample (the default)
    "packed"   a micro-batch's samples go to the dp ranks by token cost, each rank's packed into
               one row (or, under `max_tokens_per_micro_batch`, a few rows of at most that many
               tokens) with positions restarting at 0 per sample (step/packing.py)

`packed_attention` says how a dense attention kernel (sdpa, eager) attends inside packed rows
(models/per_sample_attention.py): "per_sample" (each sample's own causal attention, one kernel call
per sample; the default where the decoder allows it) or "row_mask" (the whole row under the
block-diagonal mask transformers builds, rows cut to cost that least: step/rows.py).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import HeteroConfigError
from .schema import LANGUAGE_BATCHINGS, PACKED_ATTENTIONS, SECTION


def parse_language_batching(section: Mapping[str, Any]) -> tuple[str, int | None]:
    """(language_batching, max_tokens_per_micro_batch) of the section, checked."""
    field = f"{SECTION}.language_batching"
    batching = section.get("language_batching", "samples")
    if batching not in LANGUAGE_BATCHINGS:
        raise HeteroConfigError(field, f"got {batching!r}; valid values are {' or '.join(map(repr, LANGUAGE_BATCHINGS))}")
    budget = section.get("max_tokens_per_micro_batch")
    bfield = f"{SECTION}.max_tokens_per_micro_batch"
    if budget is None:
        return batching, None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise HeteroConfigError(bfield, f"must be a positive integer (tokens of one packed row), got {budget!r}")
    _packed_only(bfield, batching)
    return batching, budget


def parse_packed_attention(section: Mapping[str, Any], batching: str) -> str | None:
    """`packed_attention` of the section, checked (None: absent, the model decides)."""
    field = f"{SECTION}.packed_attention"
    choice = section.get("packed_attention")
    if choice is None:
        return None
    if choice not in PACKED_ATTENTIONS:
        raise HeteroConfigError(field, f"got {choice!r}; valid values are {' or '.join(map(repr, PACKED_ATTENTIONS))}")
    _packed_only(field, batching)
    return choice


def _packed_only(field: str, batching: str) -> None:
    """A packed-only key given with another batching is refused by name."""
    if batching != "packed":
        raise HeteroConfigError(
            field, f"applies to language_batching \"packed\" only (got {batching!r}: each sample is its own "
            "padded row); remove it or set language_batching to \"packed\"")
