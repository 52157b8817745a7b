"""Reading a DeepSpeed config from a dict, a JSON file or a YAML file (no validation here)."""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Mapping

from ..errors import HeteroConfigError


def read_ds_config(source: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """A DeepSpeed config from a dict, a JSON file or a YAML file."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    path = os.fspath(source)
    if os.path.isdir(path):
        raise HeteroConfigError("config", f"{path!r} is a directory; give the path of a DeepSpeed JSON or YAML file")
    if not os.path.isfile(path):
        raise HeteroConfigError("config", f"file {path!r} does not exist; give a DeepSpeed JSON or YAML path or a dict")
    with open(path) as f:
        text = f.read()
    try:
        if path.lower().endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError
        raise HeteroConfigError("config", f"cannot parse {path!r}: {exc}") from None
    if not isinstance(data, dict):
        raise HeteroConfigError("config", f"{path!r} must hold a mapping at the top level, got {type(data).__name__}")
    return data
