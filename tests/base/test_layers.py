"""The package's layer order (docs/internals.md, the ```layers block) holds: no module imports a layer above
its own or crosses a `never` edge, function-level imports included, and every room is in a layer."""

import os
import shutil

import ds_hetero
from tests.helpers.layers import read_layers, violations

PACKAGE = os.path.dirname(ds_hetero.__file__)
DOC = os.path.join(os.path.dirname(PACKAGE), "docs", "internals.md")


def _order():
    return read_layers(open(DOC).read())


def test_no_module_imports_a_layer_above_its_own():
    layer_of, never = _order()
    assert violations(PACKAGE, layer_of, never) == []


def test_every_room_of_the_package_is_in_the_order():
    layer_of, _ = _order()
    rooms = {name[:-3] if name.endswith(".py") else name for name in os.listdir(PACKAGE)
             if (name.endswith(".py") or os.path.isfile(os.path.join(PACKAGE, name, "__init__.py")))}
    assert rooms - set(layer_of) == set()


def _planted(tmp_path, room_file: str, line: str) -> str:
    copy = tmp_path / "ds_hetero"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / room_file
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {line}\n")
    return str(copy)


def test_negative_control_an_upward_function_level_import_is_found(tmp_path):
    """The layout (bottom layer) importing the engine inside a function: reported."""
    layer_of, never = _order()
    found = violations(_planted(tmp_path, "layout.py", "from .engine import HeteroEngine"), layer_of, never)
    assert len(found) == 1 and "ds_hetero.layout imports ds_hetero.engine" in found[0]


def test_negative_control_a_forbidden_edge_is_found(tmp_path):
    """The planner importing entry (allowed by the order alone, forbidden by a `never` line): reported."""
    layer_of, never = _order()
    assert "engine" in never["planner"] and layer_of["engine"] < layer_of["planner"]
    found = violations(_planted(tmp_path, "planner/__init__.py", "from ..engine import HeteroEngine"),
                       layer_of, never)
    assert len(found) == 1 and "planner never imports engine" in found[0]
