"""The ``ts`` import alias: handlers written for TorchServe run unchanged without TorchServe installed.

``install_ts_alias()`` puts a finder first on ``sys.meta_path`` that answers the names in ``ALIASES`` with
servetune's own module objects, so ``from ts.torch_handler.base_handler import BaseHandler`` yields
``servetune.handlers.base.BaseHandler`` itself (class identity and ``isinstance`` hold). The packages
``ts``, ``ts.torch_handler``, ``ts.utils``, ``ts.metrics``, ``ts.handler_utils`` and ``ts.protocol`` are small stand-in
modules.

When the real TorchServe is installed, ours wins inside servetune workers (``load_service`` installs the
alias): aliased names always resolve to servetune, real ``ts`` modules imported earlier are evicted from
``sys.modules``, and the stand-in packages search the real package's folders, so a module servetune does
not provide (``ts.torch_handler.request_envelope.json``, say) still loads from TorchServe. Processes that
never call ``install_ts_alias`` are untouched.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

import servetune

__all__ = ["ALIASES", "install_ts_alias", "uninstall_ts_alias"]

#: ``ts`` module name -> servetune module it is (None: a stand-in package)
ALIASES: dict[str, str | None] = {
    "ts": None,
    "ts.context": "servetune.handlers.context",
    "ts.torch_handler": None,
    "ts.torch_handler.base_handler": "servetune.handlers.base",
    "ts.torch_handler.vision_handler": "servetune.handlers.vision",
    "ts.torch_handler.image_classifier": "servetune.handlers.image_classifier",
    "ts.torch_handler.object_detector": "servetune.handlers.object_detector",
    "ts.torch_handler.image_segmenter": "servetune.handlers.image_segmenter",
    "ts.torch_handler.text_handler": "servetune.handlers.text",
    "ts.torch_handler.text_classifier": "servetune.handlers.text_classifier",
    "ts.utils": None,
    "ts.utils.util": "servetune.handlers.util",
    "ts.metrics": None,
    "ts.metrics.dimension": "servetune.handlers.metrics",
    "ts.metrics.metric_type_enum": "servetune.handlers.metrics",
    "ts.handler_utils": None,
    "ts.handler_utils.timer": "servetune.handlers.metrics",
    "ts.handler_utils.utils": "servetune.handlers.streaming",
    "ts.protocol": None,
    "ts.protocol.otf_message_handler": "servetune.handlers.streaming",  # its deprecated send_intermediate_...
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str | None, search_path: list[str]) -> None:
        self._target = target
        self._search_path = search_path
        self._original_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        if self._target is None:
            return None  # a fresh, empty stand-in package
        module = importlib.import_module(self._target)
        self._original_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        if self._target is None:
            module.__version__ = servetune.__version__  # type: ignore[attr-defined]
            module.__path__ = list(self._search_path)
        elif self._original_spec is not None:
            # the import system stamped our alias spec on the real module; give it back its own
            module.__spec__ = self._original_spec


class _TsAliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, real_ts_dirs: list[str]) -> None:
        self._real_ts_dirs = real_ts_dirs

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in ALIASES:
            return None
        target_name = ALIASES[fullname]
        is_package = target_name is None
        search_path: list[str] = []
        if is_package:
            relative = fullname.split(".")[1:]
            search_path = [os.path.join(d, *relative) for d in self._real_ts_dirs]
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(target_name, search_path), is_package=is_package)


def _real_ts_dirs() -> list[str]:
    """Folders of an installed TorchServe ``ts`` package, found without importing it."""
    try:
        spec = importlib.machinery.PathFinder.find_spec("ts")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return list(spec.submodule_search_locations)


def _installed() -> _TsAliasFinder | None:
    return next((f for f in sys.meta_path if isinstance(f, _TsAliasFinder)), None)


def install_ts_alias() -> None:
    """Make ``import ts...`` resolve to servetune (idempotent)."""
    if _installed() is not None:
        return
    for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
        del sys.modules[name]  # a real TorchServe imported earlier would shadow the alias
    sys.meta_path.insert(0, _TsAliasFinder(_real_ts_dirs()))


def uninstall_ts_alias() -> None:
    """Remove the finder and the ``ts`` modules it provided."""
    finder = _installed()
    if finder is None:
        return
    sys.meta_path.remove(finder)
    for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
        del sys.modules[name]
