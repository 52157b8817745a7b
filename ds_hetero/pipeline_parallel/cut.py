"""Which decoder layers each pipeline stage holds: the counts of `stages.language.pp` / `pp_layers`
(parsed in config/pipeline_keys.py) checked against the model's layers."""

from __future__ import annotations

from ..config.schema import LANGUAGE, SECTION
from ..errors import HeteroConfigError


def layer_cut(n_layers: int, pp: int, pp_layers: tuple[int, ...] | None = None) -> tuple[range, ...]:
    """The decoder layers of each pipeline stage, in order (HeteroConfigError if they do not fit)."""
    field = f"{SECTION}.stages.{LANGUAGE}"
    if pp > n_layers:
        raise HeteroConfigError(
            f"{field}.pp", f"got {pp}, but the language model has {n_layers} decoder layers: every pipeline stage "
            f"needs at least one; use pp <= {n_layers}")
    if pp_layers is None:
        base, extra = divmod(n_layers, pp)
        counts = [base + (k < extra) for k in range(pp)]
    else:
        counts = list(pp_layers)
        if sum(counts) != n_layers:
            raise HeteroConfigError(
                f"{field}.pp_layers", f"{list(counts)} sums to {sum(counts)}, but the language model has {n_layers} "
                "decoder layers; make the counts add up to it")
    cut, start = [], 0
    for n in counts:
        cut.append(range(start, start + n))
        start += n
    return tuple(cut)
