"""Find a model's handler from the manifest's ``model.handler`` string, as TorchServe's ``ts/model_loader.py``.

The string is ``file.py``, ``module``, ``module:function`` or a built-in name. A module found in the model
directory (or importable) wins over a built-in of the same name, like TorchServe; a string that names a file
(``x.py``, ``dir/x``) loads only the model directory's own ``x.py``, never one found elsewhere on the path.
The entry point is the module's ``handle(data, context)`` function (initialised by ``handle(None, context)``)
or, failing that, the module's one class, instantiated, with ``initialize(context)`` and ``handle(data, context)``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from servetune._exceptions import HandlerError
from servetune.builtin_handlers import BUILTIN_HANDLERS
from servetune.handlers.context import Context
from servetune.handlers.util import list_classes_from_module

__all__ = ["BUILTIN_HANDLERS", "EntryPoint", "heavy_imports", "resolve_entry_point"]

EntryPoint = Callable[[Any, Context], Any]


def forget_shadowed_modules(model_dir: Path) -> None:
    """Drop cached modules that a file of ``model_dir`` should now provide (several models, one interpreter)."""
    root = model_dir.resolve()
    for path in model_dir.iterdir():
        name = path.stem if path.suffix == ".py" else path.name if (path / "__init__.py").is_file() else None
        module = sys.modules.get(name) if name else None
        origin = getattr(module, "__file__", None)
        if module is not None and origin is not None and not Path(origin).resolve().is_relative_to(root):
            del sys.modules[name]  # type: ignore[arg-type]
    importlib.invalidate_caches()


def import_handler_module(handler: str, model_dir: Path) -> tuple[ModuleType, str | None]:
    """The module named by ``handler`` and the function name after ``:``, if any."""
    module_part, _, function_name = handler.partition(":")
    module_name = module_part.strip()
    names_file = module_name.endswith(".py") or "/" in module_name or "\\" in module_name
    if module_name.endswith(".py"):
        module_name = module_name[:-3]
    module_name = module_name.replace("\\", "/").rsplit("/", 1)[-1]
    if not module_name:
        raise HandlerError(f"handler {handler!r} names no module")
    if names_file and not (
        (model_dir / f"{module_name}.py").is_file() or (model_dir / module_name / "__init__.py").is_file()
    ):
        # A file, not a module: only the model's own (TorchServe would import the basename from anywhere on the
        # path, the server's working directory included).
        raise HandlerError(f"handler {handler!r}: no {module_name}.py in the model directory {model_dir}")
    if _is_importable(module_name):
        module = importlib.import_module(module_name)
    elif module_name in BUILTIN_HANDLERS:
        module = importlib.import_module(BUILTIN_HANDLERS[module_name])
    else:
        raise HandlerError(
            f"Unable to load module {module_part!r}: no {module_name}.py in {model_dir}, no importable module "
            f"{module_name!r}, and not a built-in handler ({', '.join(sorted(BUILTIN_HANDLERS))})"
        )
    return module, function_name.strip() or None


def _is_importable(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        return False


def resolve_entry_point(module: ModuleType, function_name: str | None) -> tuple[EntryPoint, Callable[[Context], Any]]:
    """``(handle, initialize)`` for a loaded handler module."""
    name = function_name or "handle"
    if hasattr(module, name):
        entry = getattr(module, name)
        if not callable(entry):
            raise HandlerError(f"{module.__name__}.{name} is not callable")
        return entry, lambda context: entry(None, context)
    if function_name is not None:
        raise HandlerError(f"module {module.__name__!r} has no function {function_name!r}")
    classes = list_classes_from_module(module)
    if len(classes) != 1:
        found = ", ".join(cls.__name__ for cls in classes) or "none"
        raise HandlerError(
            f"Expected only one class in custom service code or a function entry point in {module.__name__!r}; "
            f"found classes: {found}"
        )
    service = classes[0]()
    for method in ("initialize", "handle"):
        if not callable(getattr(service, method, None)):
            raise HandlerError(f"handler class {classes[0].__name__} has no {method}(...) method")
    return service.handle, service.initialize


#: packages whose import costs a worker hundreds of MB and a second or more (torch's own ~290 MB of private memory
#: with torch 2.14): a model whose code imports one is worth loading once in a parent that forks its workers
HEAVY_PACKAGES = frozenset(
    {"torch", "torchvision", "torchaudio", "torchtext", "ts", "transformers", "diffusers", "sentence_transformers"}
    | {"tensorflow", "keras", "jax", "onnxruntime", "tensorrt", "vllm", "timm", "ultralytics"}
)
_SCAN_FILES = 200  # an archive's Python files read to decide, at most
_SCAN_BYTES = 1 << 20  # per file


def heavy_imports(manifest: dict[str, Any], model_dir: Path) -> str | None:
    """Why the model's code is heavy to import (a sentence), or None: a built-in handler (they all use torch), a
    model file or serialized weights in the manifest, or a Python file of the model directory that imports one of
    :data:`HEAVY_PACKAGES` anywhere in it (inside a function too: ``initialize`` runs in the loading parent). Read from
    the files, nothing imported; a handler that reaches torch only through a module outside the archive is missed
    (its workers then start as fresh interpreters, as without a parent)."""
    info = manifest.get("model") or {}
    handler = str(info.get("handler") or "").partition(":")[0].strip().removesuffix(".py")
    stem = handler.replace("\\", "/").rsplit("/", 1)[-1]
    own = (model_dir / f"{stem}.py").is_file() or (model_dir / stem / "__init__.py").is_file()
    if stem in BUILTIN_HANDLERS and not own:
        return f"the built-in handler {stem} uses torch"
    for key in ("serializedFile", "modelFile"):
        if info.get(key):
            return f"the manifest names a {key} ({info[key]})"
    files = sorted(p for p in model_dir.rglob("*.py") if ".servetune-variants" not in p.parts)[:_SCAN_FILES]
    for path in files:
        found = _imported_heavy(path)
        if found:
            return f"{path.relative_to(model_dir)} imports {found}"
    return None


def _imported_heavy(path: Path) -> str | None:
    try:
        if path.stat().st_size > _SCAN_BYTES:
            return None
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            if name.split(".")[0] in HEAVY_PACKAGES:
                return name
    return None
