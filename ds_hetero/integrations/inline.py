"""`hetero_parallel` for DeepSpeed settings that are not a JSON file: the `DS_HETERO_PARALLEL` variable.

TRL's examples put DeepSpeed in an Accelerate YAML (`deepspeed_config: {zero_stage: 3, ...}`, no
JSON), ms-swift turns `--deepspeed zero3` into a dict, LLaMA-Factory builds a DeepSpeedPlugin: none
has a place for ds_hetero's section. The one way to give it there:

    DS_HETERO_PARALLEL=hetero.yaml accelerate launch --config_file deepspeed_zero3.yaml sft_vlm.py ...

names a JSON or YAML file holding the section (`{"hetero_parallel": {...}}`, or the section's
content itself). It is merged into the DeepSpeed config the Trainer or Accelerate built, then read,
parsed and checked exactly as the section of a JSON (`ds-hetero validate --hetero-parallel FILE`
checks it the same way). A DeepSpeed config that has its own section and the variable is an
error (two sources). While the variable is set, a plain `deepspeed.initialize` (stock Trainer,
`accelerator.prepare`) refuses to train homogeneously, as for a JSON with the section.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from ..config import SECTION, read_ds_config
from ..errors import HeteroConfigError

ENV = "DS_HETERO_PARALLEL"


def inline_section(environ: Mapping[str, str] = os.environ) -> dict[str, Any] | None:
    """The section from the file `DS_HETERO_PARALLEL` names (None when unset)."""
    path = environ.get(ENV, "").strip()
    if not path:
        return None
    data = read_ds_config(path)
    section = data.get(SECTION, data)
    if not isinstance(section, dict) or not section:
        raise HeteroConfigError(ENV, f"{path!r} must hold a '{SECTION}' mapping (or the section's content)")
    return section


def with_inline_section(config: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The DeepSpeed config with the variable's section merged in (a copy; unchanged when unset)."""
    cfg = dict(config)
    section = inline_section(environ)
    if section is None:
        return cfg
    if SECTION in cfg:
        raise HeteroConfigError(ENV, f"both the DeepSpeed config and {ENV}={environ[ENV]!r} give '{SECTION}'; "
                                f"keep one")
    cfg[SECTION] = section
    return cfg
