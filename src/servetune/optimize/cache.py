"""Where converted artifacts live: ``<cache_dir>/<variant>-<key><suffix>``.

Workers and ``servetune optimize`` share one cache directory per user (:func:`default_cache_dir`:
``$SERVETUNE_VARIANT_CACHE``, else ``$XDG_CACHE_HOME/servetune/variants``, else ``~/.cache/servetune/variants``),
so a model's compiled package outlives the server that built it: a restart, another worker or a later
``servetune optimize`` of the same model on the same torch and device finds it. Nothing evicts entries; delete the
directory to reclaim the space.

The key hashes what a conversion depends on: the variant, the torch version, the device type, the model's
structure, source and weights, the example inputs' dtypes and shapes past the batch dimension, and what the
variant adds (``extra``: the exported variants' batch bounds, the CPU ISA or GPU a compiled package is built for).
A stale artifact would still be caught by the parity check, which runs on every load.

A cache directory that cannot be created (a read-only disk) means no cache: the variant converts in memory and
says so in its notes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from servetune.optimize._tree import flat_tensors
from servetune.optimize.base import Stage

CACHE_ENV = "SERVETUNE_VARIANT_CACHE"


def default_cache_dir() -> Path:
    """The per-user variant cache: ``$SERVETUNE_VARIANT_CACHE``, else ``$XDG_CACHE_HOME/servetune/variants``, else
    ``~/.cache/servetune/variants``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servetune" / "variants"


def cache_key(stage: Stage, extra: str = "") -> str:
    """A 16-hex-digit digest of everything the stage's conversion depends on (``extra``: what the variant adds)."""
    digest = hashlib.sha256()
    model = stage.source

    def add(text: str) -> None:
        digest.update(text.encode())
        digest.update(b"\0")

    add(stage.name)
    add(torch.__version__)
    add(stage.device.type)
    add(type(model).__qualname__)
    add(repr(model))
    add(str(getattr(model, "code", "")))
    try:
        add(inspect.getsource(type(model)))
    except (OSError, TypeError):
        pass  # built-in or dynamically made class: structure and weights still count
    for name, tensor in model.state_dict().items():
        add(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}")
        data = tensor.detach().cpu().contiguous()
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    for tensor in flat_tensors(stage.example_inputs or ()):
        add(f"input:{tensor.dtype}:{tuple(tensor.shape[1:])}")
    add(extra)
    return digest.hexdigest()[:16]


def artifact_path(stage: Stage, suffix: str, extra: str = "") -> Path | None:
    """The artifact's path in the stage's cache directory (created), or None when the stage has no cache or it
    cannot be created."""
    if stage.cache_dir is None:
        return None
    try:
        stage.cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # compiled code is loaded from here
    except OSError as exc:
        stage.notes.append(f"no cache ({stage.cache_dir}: {exc.strerror or exc})")
        return None
    safe = stage.name.replace("+", "_")
    path = stage.cache_dir / f"{safe}-{cache_key(stage, extra)}{suffix}"
    if not path.exists() and not os.access(stage.cache_dir, os.W_OK):
        stage.notes.append(f"no cache ({stage.cache_dir} is read-only)")
        return None
    return path


@contextlib.contextmanager
def building(path: Path | None) -> Iterator[Path | None]:
    """Hold ``path``'s build lock (workers of one model building one artifact take turns: the second finds it built)
    and yield a scratch file beside it to write; it replaces ``path`` atomically if the block ends well. Without a
    cache (``path`` None) yields None and locks nothing."""
    if path is None:
        yield None
        return
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".partial{path.suffix}")
        os.close(fd)
        scratch = Path(name)
        try:
            yield scratch
            if scratch.stat().st_size and not path.exists():
                os.replace(scratch, path)
        finally:
            scratch.unlink(missing_ok=True)
