"""The package's layer order, read from docs/internals.md, and the imports that break it.

docs/internals.md holds a fenced block tagged `layers`: one line per layer, bottom to top,
`<index> <name> <room> <room> ...` (a room is a top-level module or sub-package of ds_hetero; `__init__`
is the package root), then `never <room> -> <room> ...` lines for edges the order alone allows but the
design forbids. A module may import its own layer (no cycle between rooms: import_cycles.py --folders)
and the layers below; every import counts, at module level and inside functions.
"""

from __future__ import annotations

import ast
import os
import re

BLOCK = re.compile(r"```layers\n(.*?)```", re.S)


def read_layers(doc: str) -> tuple[dict[str, int], dict[str, set[str]]]:
    """(room -> layer index, room -> rooms it must never import) from the doc's `layers` block."""
    match = BLOCK.search(doc)
    if match is None:
        raise ValueError("docs/internals.md has no ```layers block")
    layer_of, never = {}, {}
    for line in match.group(1).splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "never":
            src, arrow, *targets = words[1:]
            assert arrow == "->", line
            never.setdefault(src, set()).update(targets)
            continue
        index, _name, *rooms = words
        for room in rooms:
            layer_of[room] = int(index)
    return layer_of, never


def _module_name(package_dir: str, path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(package_dir))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def imports(package_dir: str) -> dict[str, set[str]]:
    """Module -> the package's modules (or sub-packages) it imports, module-level and function-level."""
    pkg = os.path.basename(package_dir.rstrip(os.sep))
    out: dict[str, set[str]] = {}
    for folder, _, names in os.walk(package_dir):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            mod = _module_name(package_dir, path)
            is_pkg = name == "__init__.py"
            targets = out.setdefault(mod, set())
            for node in ast.walk(ast.parse(open(path).read(), path)):
                if isinstance(node, ast.Import):
                    targets.update(a.name for a in node.names if a.name.split(".")[0] == pkg)
                elif isinstance(node, ast.ImportFrom):
                    if node.level == 0:
                        base = node.module or ""
                    else:
                        parts = mod.split(".") if is_pkg else mod.split(".")[:-1]
                        parts = parts[: len(parts) - (node.level - 1)]
                        base = ".".join(parts + ([node.module] if node.module else []))
                    if base.split(".")[0] != pkg:
                        continue
                    # `from . import x` names submodules: count each as its own target
                    targets.update(f"{base}.{a.name}" if base.count(".") == 0 else base for a in node.names)
    return out


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def violations(package_dir: str, layer_of: dict[str, int], never: dict[str, set[str]]) -> list[str]:
    """Every import that climbs a layer or crosses a `never` edge, and every room the order does not name."""
    found = []
    for mod, targets in sorted(imports(package_dir).items()):
        src = room(mod)
        if src not in layer_of:
            found.append(f"{mod}: room {src!r} is in no layer of docs/internals.md")
            continue
        for target in sorted(targets):
            dst = room(target)
            if dst == src or dst not in layer_of:
                continue
            if layer_of[dst] > layer_of[src]:
                found.append(f"{mod} imports {target}: layer {layer_of[dst]} ({dst}) is above {layer_of[src]} ({src})")
            elif dst in never.get(src, ()):
                found.append(f"{mod} imports {target}: {src} never imports {dst}")
    return found
