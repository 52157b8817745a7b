"""The language stage's pipeline axis: `stages.language.pp` and `stages.language.pp_layers`.

    "language": {"tp": 2, "dp": 1, "pp": 2, "pp_layers": [1, 3]}

`pp` cuts the decoder's layers into pp contiguous chunks (pipeline stages), evenly by default
(the first chunks take one more layer when pp does not divide the layer count, as Megatron's
even split does); `pp_layers` gives every chunk's layer count, e.g. fewer layers in a first
stage that also carries the embeddings (Megatron's `--decoder-first-pipeline-num-layers`).
Pure: parsing needs no model; pipeline_parallel/cut.py `layer_cut` checks the counts against the model's layers.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import HeteroConfigError
from .schema import LANGUAGE, SECTION


def parse_pipeline(name: str, raw: Mapping[str, Any], positive_int) -> tuple[int, tuple[int, ...] | None]:
    """(pp, pp_layers or None) of one stage's spec; HeteroConfigError naming the field."""
    field = f"{SECTION}.stages.{name}"
    pp = positive_int(raw.get("pp", 1), f"{field}.pp")
    layers = raw.get("pp_layers")
    if name != LANGUAGE:
        if pp != 1:
            raise HeteroConfigError(
                f"{field}.pp", f"got {pp}; only the language stage is pipelined (every encoder runs outside the "
                "pipeline, in its own layout): remove the key")
        if layers is not None:
            raise HeteroConfigError(f"{field}.pp_layers", "applies to the language stage only; remove it")
        return 1, None
    if layers is None:
        return pp, None
    if not isinstance(layers, (list, tuple)) or any(isinstance(x, bool) or not isinstance(x, int) or x < 1
                                                    for x in layers):
        raise HeteroConfigError(f"{field}.pp_layers", f"must be a list of positive layer counts, got {layers!r}")
    if len(layers) != pp:
        raise HeteroConfigError(
            f"{field}.pp_layers", f"lists {len(layers)} chunks but pp is {pp}; give one layer count per pipeline stage")
    return pp, tuple(layers)
