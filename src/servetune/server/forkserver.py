"""A model's parent process: loads the model once and forks its workers, so that they share torch's and the model's
pages copy-on-write and start without importing or loading anything.

Started by the frontend (``servetune.server.parent``) as ``python -m servetune.server.forkserver FD [MODULES]``, with
``subprocess.Popen`` — the frontend itself never forks. ``MODULES`` (comma-separated; ``servetune.server.early``): a
start-up model's torch packages, imported while the frontend still starts, before the model is sent. Its first frame is
a ``Preload``: the model's :class:`~servetune.handlers.spec.WorkerSpec` and how far to go
(``servetune.handlers.spec.preload``: the handler's imports, or the whole model). It preloads with one torch thread,
then checks that a fork would be sound (:func:`fork_hazard`: one thread, no CUDA, no file left open by the preload) and
answers ``Preloaded``; if not sound, it says why and exits. Then, for each ``Fork`` (which carries the worker's end of
its socket pair), it forks a worker (``servetune.server.worker.forked_main``) and answers its pid with a pidfd of it,
and it reports each worker's exit (``Exited``), as it is their parent and reaps them.

It never runs an event loop, gRPC or a second thread (so forking it is safe: a child gets one thread, and no lock held
by another), and it exits when the frontend closes the socket or dies (PDEATHSIG, and a pidfd of the frontend in its
``select``). The workers it forked outlive it: each watches the frontend, not its parent.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import select
import signal
import socket
import sys
import time
import traceback

from servetune.handlers.service import Service
from servetune.handlers.spec import preload
from servetune.server import worker
from servetune.server.fork_messages import Exited, Fork, Forked, ForkMessage, Preload, Preloaded, decode_fork_message
from servetune.server.messages import FrameBuffer, LoadError, ProtocolError, recv_chunk
from servetune.startup import CLOCK


def open_fds() -> dict[int, str]:
    """This process's open file descriptors and what each one is (``/proc/self/fd``)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the descriptor of the listing itself, closed by now
            continue
    return found


def _thread_names() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                names.append(fh.read().strip())
        except OSError:
            continue
    return names


def fork_hazard(before: dict[int, str] | None = None) -> str:
    """Why forking this process now would not be sound, or "" when it is: a second thread (the child would have its
    locks but not the thread: torch's OpenMP pool, a BLAS pool, a thread the handler started), CUDA initialised (a
    forked child cannot use it), or descriptors the preload left open that are not in ``before`` (every worker would
    share one file offset, one socket)."""
    threads = _thread_names()
    if len(threads) > 1:
        return f"{len(threads)} threads run in it ({', '.join(sorted(threads))}); a forked child would have one"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "CUDA is initialised in it; a forked child cannot use CUDA"
    if before is not None:
        opened = sorted({target for fd, target in open_fds().items() if fd not in before})
        if opened:
            return (
                f"its preload left {len(opened)} file(s) open ({', '.join(opened[:4])}); the workers would share them"
            )
    return ""


def _send(ctl: socket.socket, frame: bytes, fds: list[int] | None = None) -> None:
    sent = socket.send_fds(ctl, [frame], fds) if fds else ctl.send(frame)
    if sent < len(frame):
        ctl.sendall(frame[sent:])


def _receive(ctl: socket.socket, frames: FrameBuffer) -> tuple[ForkMessage, list[int]] | None:
    """The next message (blocking), or None at EOF."""
    while True:
        frame = frames.next_frame()
        if frame is not None:
            header, blobs, fds = frame
            return decode_fork_message(header, blobs), fds
        data, fds = recv_chunk(ctl)
        if not data:
            return None
        frames.feed(data, fds)


def _die_with_frontend() -> None:
    """PDEATHSIG: the kernel kills this process when the frontend dies (no watchdog thread here: it must stay alone)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _fork(worker_fd: int, frontend: int, keep: set[int], preloaded: Service | None) -> tuple[int, str]:
    """Fork a worker serving ``worker_fd``; (its pid, "") or (0, why not)."""
    hazard = fork_hazard()
    if hazard:
        return 0, hazard
    # What the parent holds goes to the permanent generation: a child's garbage collections never visit (and so
    # never write, copying the page) those objects.
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        return 0, f"fork failed: {exc}"
    if pid:
        return pid, ""
    code = 1
    try:
        # Only its own socket and the frontend's pidfd (and what the process had before the preload): not the
        # control socket, not another worker's socket (its end would keep that worker's connection open), not the
        # parent's pidfds of the other workers.
        for fd in open_fds():
            if fd not in keep and fd not in (worker_fd, frontend):
                os.close(fd)
        code = worker.forked_main(worker_fd, frontend, preloaded)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve(ctl: socket.socket, frames: FrameBuffer, frontend: int, keep: set[int], preloaded: Service | None) -> int:
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        watched: list[int] = [ctl.fileno(), frontend, *children]
        readable, _, _ = select.select(watched, [], [])
        if frontend in readable:
            return 0
        for pidfd in [fd for fd in readable if fd in children]:
            pid = children.pop(pidfd)
            os.close(pidfd)
            _, status = os.waitpid(pid, 0)
            _send(ctl, Exited(pid, os.waitstatus_to_exitcode(status)).encode())
        if ctl.fileno() not in readable:
            continue
        data, fds = recv_chunk(ctl)
        if not data:
            return 0  # the frontend stopped this model's parent; the workers go on until it stops them
        frames.feed(data, fds)
        while (frame := frames.next_frame()) is not None:
            header, blobs, fds = frame
            message = decode_fork_message(header, blobs)
            if not isinstance(message, Fork) or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise ProtocolError(f"expected Fork with one descriptor, got {type(message).__name__} with {len(fds)}")
            [worker_fd] = fds
            try:
                pid, error = _fork(worker_fd, frontend, keep, preloaded)
            finally:
                os.close(worker_fd)
            if error:
                _send(ctl, Forked(message.seq, 0, error).encode())
                continue
            pidfd = os.pidfd_open(pid)  # before any wait: the pid cannot be reused until this process reaps it
            children[pidfd] = pid
            _send(ctl, Forked(message.seq, pid).encode(), [pidfd])


def _import_early(modules: list[str]) -> float:
    """Import what the model's load will (``servetune.server.early``) while the frontend still starts; a failure is
    left to that load to report. Milliseconds taken."""
    started = time.perf_counter()
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: S112 - the model's own load imports it again and reports the failure
            continue
    return (time.perf_counter() - started) * 1000.0


def main(argv: list[str]) -> int:
    imports_ms = CLOCK.lap_ms()
    frontend_pid = os.getppid()
    _die_with_frontend()
    worker.ignore_group_signals()
    ctl = socket.socket(fileno=int(argv[1]))
    try:
        frontend = os.pidfd_open(frontend_pid)
    except OSError:
        return 1  # the frontend sees the socket close: it starts its workers without a parent
    if os.getppid() != frontend_pid:
        return 1  # the frontend died already
    early_ms = _import_early([m for m in argv[2].split(",") if m]) if len(argv) > 2 else 0.0
    frames = FrameBuffer()
    received = _receive(ctl, frames)
    if received is None or not isinstance(received[0], Preload):
        return 1
    request = received[0]
    before = open_fds()
    start = time.perf_counter()
    try:
        preloaded = preload(request.spec, request.level)
    except BaseException as exc:  # the handler's failure, verbatim, as a worker reports it
        _send(ctl, LoadError(f"{type(exc).__name__}: {exc}", traceback.format_exc()).encode())
        return 1
    load_ms = (time.perf_counter() - start) * 1000.0
    hazard = fork_hazard(before)
    torch = "torch" in sys.modules
    _send(ctl, Preloaded(os.getpid(), load_ms, CLOCK.interpreter_ms, imports_ms, torch, hazard, early_ms).encode())
    if hazard:
        return 1
    keep = {fd for fd in before if fd > 2 and fd not in (ctl.fileno(), frontend)} | {0, 1, 2}
    try:
        return _serve(ctl, frames, frontend, keep, preloaded)
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the frontend closed the socket while a report went out: it stopped this parent
    except (OSError, ProtocolError) as exc:  # the frontend sent garbage, or the system refused something
        print(f"servetune model parent {os.getpid()}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
