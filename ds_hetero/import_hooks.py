"""Run a function right after another library is imported, or now if it already is.

Why: `import ds_hetero` patches DeepSpeed (patches.py: the guard on `deepspeed.initialize`, the
skipped CPU shm op build), but importing DeepSpeed (and with it torch) costs seconds, which a
command that only reads a JSON file (`ds-hetero validate`) should not pay. So the package root
no longer imports DeepSpeed: it asks for its patches here, and they run the moment anything
imports `deepspeed` (a user's script, transformers' Trainer, ds_hetero's own engine), before
that import returns, so no caller can reach an unpatched `deepspeed.initialize`.

The finder below sits first on `sys.meta_path` until the module is imported. It finds the module
as the other finders would and wraps its loader's `exec_module` once, for this one load.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str):
        self.name = name
        self.callbacks: list[Callable[[], None]] = []
        self._searching = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or getattr(self._searching, "on", False):
            return None
        self._searching.on = True  # find it as if this finder were not there
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._searching.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, hook = spec.loader, self
        original = loader.exec_module

        def exec_module(module):
            try:
                original(module)
            finally:
                try:
                    del loader.exec_module  # back to the class's method: this wrapper served one load
                except AttributeError:
                    pass
            hook.fire()

        loader.exec_module = exec_module
        return spec

    def fire(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _pending.pop(self.name, None)
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


_pending: dict[str, _AfterImport] = {}
_lock = threading.Lock()


def when_imported(name: str, callback: Callable[[], None]) -> None:
    """Call `callback()` once top-level module `name` is imported: now if it is, else right after its import."""
    with _lock:
        if name not in sys.modules:
            finder = _pending.get(name)
            if finder is None:
                finder = _pending[name] = _AfterImport(name)
                sys.meta_path.insert(0, finder)
            finder.callbacks.append(callback)
            return
    callback()
