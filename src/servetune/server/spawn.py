"""A fresh interpreter started by the frontend without forking it, and its exit noticed at once.

``subprocess.Popen`` is vfork + exec on Linux: between the two the child runs only the C code that sets up its file
descriptors, and no fork handler of any library. Not asyncio's ``create_subprocess_exec``: under uvloop that is
libuv's ``uv_spawn``, a real ``fork()`` of the frontend, which runs gRPC's and Python's fork handlers in a copy of a
process whose gRPC threads were busy — the child then crashed (SIGSEGV or SIGABRT in gRPC's ``event_engine``) before
it could exec: 7 of 200 worker starts beside busy gRPC servers (``benchmarks/grpc_scaling.py``). Workers and the
model parents that fork workers (``servetune.server.forkserver``) are both started this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable


def spawn(module: str, fd: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python -m MODULE FD``, inheriting ``fd`` (its end of a socket pair) and no other file."""
    return subprocess.Popen(
        [sys.executable, "-m", module, str(fd)],
        pass_fds=(fd,),
        env=env,
        stdin=subprocess.DEVNULL,
        close_fds=True,
    )


def watch_exit(
    loop: asyncio.AbstractEventLoop, proc: subprocess.Popen[bytes], on_exit: Callable[[], None], name: str
) -> None:
    """Reap ``proc`` and call ``on_exit`` once it exits: its pidfd turns readable (Linux 5.3+), else a thread waits."""

    def reaped() -> None:
        proc.poll()
        on_exit()

    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux, or an old kernel
        threading.Thread(
            target=lambda: (proc.wait(), loop.call_soon_threadsafe(reaped)), name=f"{name}-wait", daemon=True
        ).start()
        return

    def readable() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        reaped()

    loop.add_reader(pidfd, readable)


def describe_exit(code: int | None) -> str:
    """``exit code 3``, ``killed by SIGSEGV``, or ``still running`` (None)."""
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


def pidfd_supported() -> bool:
    """Whether this kernel and Python have pidfds (``os.pidfd_open``, Linux 5.3+): a worker forked by a model parent
    watches the frontend through one, and the frontend signals that worker through one (never a reused pid)."""
    try:
        fd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        return False
    os.close(fd)
    return hasattr(signal, "pidfd_send_signal")


__all__ = ["describe_exit", "pidfd_supported", "spawn", "watch_exit"]
