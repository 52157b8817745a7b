"""Reading a DeepSpeed config from a dict, a JSON file or a YAML file (no validation here)."""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Mapping

from ..errors import ConfigFileError, HeteroConfigError


def read_ds_config(source: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """A DeepSpeed config from a dict, a JSON file or a YAML file."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    path = os.fspath(source)
    if os.path.isdir(path):
        raise ConfigFileError(path, "is a directory; give the path of a DeepSpeed JSON or YAML file")
    if not os.path.isfile(path):
        raise ConfigFileError(path, "does not exist; give a DeepSpeed JSON or YAML path or a dict")
    with open(path) as f:
        text = f.read()
    data = _parse_yaml(path, text) if path.lower().endswith((".yaml", ".yml")) else _parse_json(path, text)
    if not isinstance(data, dict):
        raise ConfigFileError(path, f"must hold a mapping at the top level, got {type(data).__name__}")
    return data


def _parse_json(path: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:  # where, as an editor shows it (1-based line and column)
        raise ConfigFileError(path, f"line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}") from None


def _parse_yaml(path: str, text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)  # 0-based in PyYAML
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigFileError(path, f"{where}invalid YAML: {problem}") from None
