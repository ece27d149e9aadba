"""Working directories for extracted archives that outlive no process: each is locked by the process that made it,
and a new one first removes those whose owner is gone.

A server or a Ray replica extracts its archives under a temporary directory and removes it when it stops. One that
is killed (SIGKILL, the OOM killer, Ray ending a replica's process without running ``atexit``) leaves it behind: a
model's files each time, gigabytes for a large model, until ``/tmp`` fills (a test run here left 586 replica
directories in a day). The owner holds an exclusive ``flock`` on the directory's lock file for as long as it (or a
child forked from it, which shares the lock) lives; the kernel releases it however the process ends, on any PID
namespace that shares the file system. Making a directory of the same prefix sweeps the others first: one whose lock
can be taken has no owner left and is removed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

LOCK_NAME = ".owner.lock"

_held: dict[Path, int] = {}  # directory -> its lock file's descriptor, open while it lives (closing releases it)


def owned_workdir(prefix: str, parent: str | None = None) -> Path:
    """A new directory ``<parent or the temp dir>/<prefix>XXXXXXXX``, locked by this process, after removing the
    directories of that prefix whose owner has gone. The caller removes its own with :func:`remove_workdir` when
    it stops normally."""
    root = Path(parent or tempfile.gettempdir())
    sweep(root, prefix)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    # locked under another name, then renamed (the lock stays with the file): a sweep never finds the lock file
    # before it is held
    fd = os.open(path / (LOCK_NAME + ".new"), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(path / (LOCK_NAME + ".new"), path / LOCK_NAME)
    _held[path] = fd
    return path


def remove_workdir(path: Path) -> None:
    """Remove a directory :func:`owned_workdir` made, and release its lock."""
    shutil.rmtree(path, ignore_errors=True)
    fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


def sweep(root: Path, prefix: str) -> list[Path]:
    """Remove ``root/<prefix>*`` directories whose owner is gone (their lock can be taken); those without a lock file
    are left alone (another program's, or one being made). Returns what was removed."""
    removed: list[Path] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return removed
    for path in candidates:
        try:
            fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # no lock file (or not ours to open): not a directory this module made
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # its owner, or a child forked from it, is alive (this process's own too: a lock is per open file)
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


__all__ = ["LOCK_NAME", "owned_workdir", "remove_workdir", "sweep"]
