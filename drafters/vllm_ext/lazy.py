"""Patch a vLLM module when (and only when) a process imports it.

vLLM loads general plugins in every process -- API server, engine core, each
worker -- often before the module to patch is imported. Importing the V2 GPU
model runner into the API server just to patch it would cost start-up time and
risk touching the accelerator in a process that must not, so each patch is
deferred until its module is imported in that process: immediately if it
already is, else through a `sys.meta_path` finder that runs the patch right
after the module body executes.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger("specgate.vllm_ext")

Callback = Callable[[ModuleType], None]


def _run(callbacks: list[Callback], module: ModuleType) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except Exception:  # a failed patch leaves stock vLLM behaviour, never a dead server
            logger.exception("specgate: patching %s failed; that feature stays stock", module.__name__)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, callbacks: list[Callback]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run(self._callbacks, module)

    def __getattr__(self, name):  # get_source, get_resource_reader, ... of the real loader
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.pending: dict[str, list[Callback]] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.pending.pop(fullname))
        return spec


_finder = _PostImportFinder()


def when_imported(module_name: str, callback: Callback) -> None:
    """Run callback(module) now if module_name is loaded, else right after its import."""
    module = sys.modules.get(module_name)
    if module is not None:
        _run([callback], module)
        return
    _finder.pending.setdefault(module_name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
