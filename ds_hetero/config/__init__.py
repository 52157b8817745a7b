"""The `hetero_parallel` section of a DeepSpeed config: what it holds (schema.py), reading (read.py),
validation (parse.py) and rank placement (ranks.py)."""

from .parse import load_config, parse_config
from .read import read_ds_config
from .schema import (BALANCES, DEFAULT_TIMEOUT_S, ENCODER_STAGES, DERIVED_BATCH_KEYS, LANGUAGE, LANGUAGE_BATCHINGS, MAX_TIMEOUT_S,
                     PLACEMENTS, SECTION, SECTION_KEYS, STAGE_KEYS, HeteroConfig)

__all__ = [
    "BALANCES", "DEFAULT_TIMEOUT_S", "DERIVED_BATCH_KEYS", "ENCODER_STAGES", "HeteroConfig", "LANGUAGE", "LANGUAGE_BATCHINGS",
    "MAX_TIMEOUT_S", "PLACEMENTS", "SECTION", "SECTION_KEYS", "STAGE_KEYS", "load_config",
    "parse_config", "read_ds_config",
]
