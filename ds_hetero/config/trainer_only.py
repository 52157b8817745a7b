"""`"auto"` where ds_hetero reads the value itself: a Trainer-only value, said as such.

The Hugging Face Trainer replaces "auto" by TrainingArguments values before ds_hetero sees the
config; `ds_hetero.initialize` (the launcher recipe, `ds_hetero.accelerate.prepare`) reads the JSON
as written. A Trainer-style JSON given there would otherwise stop at a bare "must be a number, got
'auto'", one key at a time, or, with numbers in those keys, deep inside DeepSpeed at the optimizer's
`lr: "auto"`. So the first such key refused lists every "auto" of the file and points to the
launcher configs. The per-stage batch keys are not among them: ds_hetero derives those and accepts
"auto" there.

Two scopes: `parse_config` (also `ds-hetero validate` and the planner, which check a Trainer JSON
after filling its batch and clipping as the Trainer would) refuses only the keys it reads as
numbers; `initialize` also refuses the optimizer's and the scheduler's, which DeepSpeed builds from the
JSON as written (under the Trainer the optimizer's arrive filled; a scheduler section is refused there).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..errors import HeteroConfigError
from .schema import DERIVED_BATCH_KEYS, SECTION

# the keys parse_config reads as numbers, in the order it reads them
READ_AS_NUMBERS = ("gradient_clipping", "train_batch_size")
# the sections DeepSpeed builds from as written when initialize makes the stage engines (under the Trainer
# the optimizer's values arrive filled, and a scheduler section is refused before: trainer_conflicts)
BUILT_AS_WRITTEN = ("optimizer", "scheduler")


def _auto_fields(value: Any, path: str = "") -> Iterator[str]:
    if value == "auto" and path:
        yield path
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            if not path and key in (*DERIVED_BATCH_KEYS, SECTION):
                continue  # accepted as "auto"; an "auto" section is the planner's (planner/auto.py)
            yield from _auto_fields(inner, f"{path}.{key}" if path else str(key))


def refuse_trainer_auto(ds: Mapping[str, Any], as_written: bool = False) -> None:
    """HeteroConfigError at the first number-valued key set to "auto" (with `as_written`, the first
    "auto" of the optimizer or scheduler section too), naming every "auto" of `ds`."""
    fields = list(_auto_fields(ds))
    refused = [key for key in READ_AS_NUMBERS if ds.get(key) == "auto"]
    if as_written:
        refused += [field for field in fields if field.split(".")[0] in BUILT_AS_WRITTEN]
    if not refused:
        return
    raise HeteroConfigError(
        refused[0], f'"auto" is a Trainer-only value: the Hugging Face Trainer fills it from TrainingArguments, '
        f"but ds_hetero.initialize (recipes/train_llava.py, ds_hetero.accelerate.prepare) reads the JSON as "
        f"written. This config has \"auto\" at {', '.join(fields)}. Use a launcher config (ds_configs/llava_*.json, "
        f"e.g. ds_configs/llava_colocated.json or ds_configs/llava_packed.json), or give those keys numbers "
        f"({' and '.join(DERIVED_BATCH_KEYS)} may stay \"auto\")")
