"""`"auto"` where ds_hetero reads the value itself: a Trainer-only value, said as such.

The Hugging Face Trainer (and Accelerate's DeepSpeed plugin) replace "auto" by TrainingArguments
values before ds_hetero sees the config; `ds_hetero.initialize` and the launcher recipes read the
JSON as written. A Trainer-style JSON given to the launcher would otherwise stop at a bare
"must be a number, got 'auto'", one key at a time, and then inside DeepSpeed for the optimizer's.
So the first such key refused lists every "auto" of the file and points to the launcher configs.
The per-stage batch keys are not among them: ds_hetero derives those and accepts "auto" there.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..errors import HeteroConfigError
from .schema import DERIVED_BATCH_KEYS, SECTION

# the keys parse_config reads as numbers, in the order it reads them
READ_AS_NUMBERS = ("gradient_clipping", "train_batch_size")


def _auto_fields(value: Any, path: str = "") -> Iterator[str]:
    if value == "auto" and path:
        yield path
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            if not path and key in (*DERIVED_BATCH_KEYS, SECTION):
                continue  # accepted as "auto"; an "auto" section is the planner's (planner/auto.py)
            yield from _auto_fields(inner, f"{path}.{key}" if path else str(key))


def refuse_trainer_auto(ds: Mapping[str, Any]) -> None:
    """HeteroConfigError at the first number-valued key set to "auto", naming every "auto" of `ds`."""
    for key in READ_AS_NUMBERS:
        if ds.get(key) != "auto":
            continue
        fields = list(_auto_fields(ds))
        raise HeteroConfigError(
            key, f'"auto" is a Trainer-only value: the Hugging Face Trainer and Accelerate fill it from '
            f"TrainingArguments, but ds_hetero.initialize (and recipes/train_llava.py) reads the JSON as written. "
            f"This config has \"auto\" at {', '.join(fields)}. Use a launcher config (ds_configs/llava_*.json, e.g. "
            f"ds_configs/llava_colocated.json or ds_configs/llava_packed.json), or give those keys numbers "
            f"({' and '.join(DERIVED_BATCH_KEYS)} may stay \"auto\")")
