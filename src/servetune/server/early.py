"""Start-up models' parent processes, started the moment ``servetune serve`` has read its configuration.

A model whose workers fork from a parent (``servetune.server.parent``) is ready when its parent has imported torch
and the model's code and loaded the model: seconds, most of a resnet18 server's start. The frontend's own start
(its API stack's imports, binding, the archive's extraction) takes about a second more before the parent would be
started. So, for each start-up model in a local ``.mar`` whose code uses torch, the frontend starts its parent first
(:func:`start`), and the parent imports the torch packages the archive's code names (:func:`early_modules`) while
the frontend imports its stack and extracts the archive: on two cores the two overlap. When the model's workers
start, :class:`~servetune.server.parent.ModelParent` takes that process (:func:`claim`) instead of starting one and
sends it the model as usual; what it does from there is unchanged.

The early imports are only a head start: the parent imports nothing the model's own load would not (torch and
torchvision/torchaudio where the archive's code imports them, a built-in handler's module), with one thread as ever,
and a failing early import is ignored (the model's load then fails or not on its own). A parent is claimed only with
the environment the model's parent would have been started with; one nobody claims (the model's ``workerPreload``
is off, its registration failed) is stopped when the start-up models have loaded (:func:`release`).

This module stays light (no asyncio, no API stack): it runs before the frontend imports anything else.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from servetune.builtin_handlers import BUILTIN_HANDLERS
from servetune.config.server import ServerConfig

log = logging.getLogger("servetune.startup")

#: the packages a parent may import before it knows its model: torch's own, which start no thread at import with
#: one OpenMP thread (a package that did would make the parent unfit to fork; it is left to the model's own load)
EARLY_PACKAGES = ("torch", "torchvision", "torchaudio")
_SCAN_BYTES = 1 << 20  # per file


def parent_environment(env: dict[str, str]) -> dict[str, str]:
    """A parent's environment: its workers' own, with one thread for every pool that starts threads at import or at
    first use (numpy's OpenBLAS starts its pool at import): a forked child gets none of the parent's threads."""
    return {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def expected_environment() -> dict[str, str]:
    """The environment a model's parent gets (``Placement.environment`` then :func:`parent_environment`): a claim
    checks it, so that a parent started early never runs with another environment than a late one would."""
    return parent_environment({**os.environ, "PYTHONUNBUFFERED": "1"})


@dataclass
class EarlyParent:
    """A parent process started before its model was registered, waiting for its ``Preload``."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket  # the frontend's end of its socket pair
    env: dict[str, str]
    modules: tuple[str, ...]
    spawned: float  # time.perf_counter() at its start


_waiting: dict[str, EarlyParent] = {}  # model name -> its parent, until claimed or released


def early_modules(archive: Path) -> tuple[str, ...]:
    """What a parent of the model in ``archive`` (a .mar, zip) imports before the model is sent to it: only what the
    model's load is sure to import. A built-in handler: torch, the handler's module, and the torch packages its
    ``modelFile`` imports at module level (the built-in handlers import it to build the model); the archive's own
    handler file: the torch packages it imports at module level (``ts``, TorchServe's, means torch). () where that
    is nothing (no early parent: a no-op or text handler's workers start without one; an import inside a function
    may never run) or the archive cannot be read here."""
    try:
        with zipfile.ZipFile(archive) as zf:
            names = set(zf.namelist())
            if zf.getinfo("MAR-INF/MANIFEST.json").file_size > _SCAN_BYTES:
                return ()  # not read here: registering the archive refuses it with the limits it checks
            manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))
            info = manifest.get("model") if isinstance(manifest, dict) else None
            if not isinstance(info, dict):
                return ()
            handler = str(info.get("handler") or "").partition(":")[0].strip().removesuffix(".py")
            stem = handler.replace("\\", "/").rsplit("/", 1)[-1]
            own = next((n for n in (f"{stem}.py", f"{stem}/__init__.py") if n in names), None)
            builtin = BUILTIN_HANDLERS.get(stem) if own is None else None
            model_file = str(info.get("modelFile") or "")
            read = [own] if own else [model_file] if builtin and model_file in names else []
            found = {"torch"} if builtin else set()
            for name in read:
                if zf.getinfo(name).file_size <= _SCAN_BYTES:
                    found |= _module_level_imports(zf.read(name))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return ()
    if not found:
        return ()
    if any(f"{p}.py" in names or f"{p}/__init__.py" in names for p in EARLY_PACKAGES):
        return ()  # the archive ships a module of torch's names: its own load decides what those imports mean
    modules = [p for p in EARLY_PACKAGES if p in found or p == "torch"]
    return (*modules, *([builtin] if builtin else []))


def _module_level_imports(source: bytes) -> set[str]:
    """The torch packages a module imports when it is imported: its top-level statements (and those under a
    top-level ``if``/``try``/``with``), not a function's or a class's."""
    try:
        body = list(ast.parse(source).body)
    except (SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    while body:
        node = body.pop()
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    body.append(child)
                elif isinstance(child, ast.ExceptHandler):
                    body.extend(child.body)
    if "ts" in found:  # TorchServe's package (servetune's alias): its handlers import torch
        found.add("torch")
    return found & set(EARLY_PACKAGES)


def _archives(config: ServerConfig, cli_models: tuple[str, ...]) -> list[tuple[str | None, Path]]:
    """The start-up models that are local .mar files, as (the name given, or None; the file), as the API server's
    ``startup_models`` reads them (a snapshot, ``all`` or a URL: none)."""
    if not cli_models and config.model_snapshot:
        return []
    out: list[tuple[str | None, Path]] = []
    for entry in cli_models or config.load_models:
        name, sep, url = entry.partition("=")
        if not sep:
            name, url = "", entry
        if url in ("all", "standalone", "none") or "://" in url or not url.endswith(".mar"):
            continue
        path = Path(url) if Path(url).is_absolute() or config.model_store is None else config.model_store / url
        if path.is_file():
            out.append((name or None, path))
    return out


def _preload_setting(config: ServerConfig, name: str) -> str:
    """``workerPreload`` for ``name`` as far as the server's configuration says (``models=``, ``worker_preload``)."""
    versions = config.models.get(name) if isinstance(config.models, dict) else None
    for entry in (versions or {}).values():
        if isinstance(entry, dict) and entry.get("workerPreload"):
            return str(entry["workerPreload"])
    return config.worker_preload


def start(config: ServerConfig, cli_models: tuple[str, ...]) -> None:
    """Start a parent for each start-up model in a local archive whose code uses torch (see the module's doc)."""
    started = time.perf_counter()
    for given, archive in _archives(config, cli_models):
        modules = early_modules(archive)
        if not modules:
            continue
        name = given or _manifest_name(archive)
        if not name or name in _waiting or _preload_setting(config, name) == "off":
            continue
        env = expected_environment()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # as servetune.server.spawn.spawn (vfork + exec, only this descriptor), with the modules to import first
            proc = subprocess.Popen(
                [sys.executable, "-m", "servetune.server.forkserver", str(theirs.fileno()), ",".join(modules)],
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as exc:
            mine.close()
            log.debug("start-up: model %s: no early parent (%s)", name, exc)
            continue
        finally:
            theirs.close()
        _waiting[name] = EarlyParent(proc, mine, env, modules, time.perf_counter())
        log.debug("start-up: model %s: parent (pid %s) started early, importing %s", name, proc.pid, ", ".join(modules))
    if _waiting:
        log.debug("start-up: early parents started %.0f ms", (time.perf_counter() - started) * 1000.0)


def _manifest_name(archive: Path) -> str | None:
    try:
        with zipfile.ZipFile(archive) as zf:
            if zf.getinfo("MAR-INF/MANIFEST.json").file_size > _SCAN_BYTES:
                return None
            name = json.loads(zf.read("MAR-INF/MANIFEST.json"))["model"]["modelName"]
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile):
        return None
    return name if isinstance(name, str) and name else None


def claim(model_name: str, env: dict[str, str]) -> EarlyParent | None:
    """The parent started early for ``model_name``, if it still runs and has ``env``; it is the caller's from now."""
    early = _waiting.pop(model_name, None)
    if early is None:
        return None
    if early.proc.poll() is not None or early.env != env:
        _stop(early)
        return None
    return early


def release() -> None:
    """Stop the parents nobody claimed (their model did not start workers from a parent)."""
    while _waiting:
        _, early = _waiting.popitem()
        _stop(early)


def _stop(early: EarlyParent) -> None:
    early.sock.close()  # it exits on EOF; killed, it cannot linger in a long import
    if early.proc.poll() is None:
        early.proc.kill()
    early.proc.wait()


__all__ = ["EarlyParent", "claim", "early_modules", "expected_environment", "parent_environment", "release", "start"]
