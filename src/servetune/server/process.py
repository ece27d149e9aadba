"""One worker process as the frontend sees it: start, wait for ready, run a batch, notice death at once.

A worker is started one of two ways, never by forking the frontend (``servetune.server.spawn`` says why): spawned, a
fresh interpreter (``python -m servetune.server.worker FD``), or forked by its model's parent process
(``servetune.server.parent``), which already imported torch, or loaded the model. Either way its :class:`WorkerSpec`
goes over its socket as the first frame (:class:`Load`), never on a command line, which has a size limit, and its
exit is watched through a pidfd (a thread where there is none).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from servetune._exceptions import WorkerDied, WorkerLoadError, WorkerTimeout
from servetune.handlers.spec import CpuSettings, WorkerSpec
from servetune.hardware import process_memory
from servetune.server.messages import (
    FrameProtocol,
    Load,
    LoadError,
    Message,
    Partial,
    Predict,
    ProtocolError,
    Ready,
    Result,
    decode_message,
)
from servetune.server.parent import ModelParent
from servetune.server.spawn import describe_exit, spawn, watch_exit
from servetune.startup import log as startup_log

EXIT_REPORT_S = 2.0  # how long a forked worker's exit code may take to come from its parent


class _Spawned:
    """A worker the frontend spawned: its child, reaped by it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid

    @property
    def gone(self) -> bool:
        return self.proc.returncode is not None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    def watch(self, loop: asyncio.AbstractEventLoop, reaped: Callable[[], None], name: str) -> None:
        watch_exit(loop, self.proc, reaped, name)


class _Forked:
    """A worker forked by its model's parent: the parent reaps it and reports its exit code; the frontend holds a
    pidfd of it (from the parent), to signal it and to see it exit, so a reused pid is never hit."""

    def __init__(self, pid: int, pidfd: int, parent: ModelParent) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.gone = False
        self._pidfd = pidfd
        self._parent = parent
        self._task: asyncio.Task[None] | None = None  # waits for the parent's report of its exit code

    def kill(self) -> None:
        if not self.gone:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def watch(self, loop: asyncio.AbstractEventLoop, reaped: Callable[[], None], name: str) -> None:
        async def exited() -> None:
            self.returncode = await self._parent.exit_code(self.pid, EXIT_REPORT_S)
            reaped()

        def readable() -> None:  # the process exited (the parent may not have reaped it yet)
            loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self.gone = True
            self._task = loop.create_task(exited(), name=f"{name}-exit")

        loop.add_reader(self._pidfd, readable)


class WorkerProcess:
    """A worker process. It runs the batches sent to it one after another and answers them in that order: the caller
    sends one batch or several at once (``send``) and waits for each (``result``)."""

    def __init__(
        self, worker_id: str, spec: WorkerSpec, env: dict[str, str], parent: ModelParent | None = None
    ) -> None:
        self.worker_id = worker_id
        self.spec = spec
        self.env = env
        self.parent = parent  # None: spawned; else forked by this parent
        self.pid: int | None = None
        self.start_time = time.time()
        self.gpu_id: int | None = spec.gpu_id
        self.load_ms = 0.0
        self.gpu_memory_bytes = 0  # peak GPU memory reserved, as of its last batch
        self.cpu: CpuSettings | None = None  # as the worker last reported them
        self.metadata: dict[str, Any] | None = None  # the handler's OIP metadata, as the worker reported it loaded
        self.on_exit: Callable[[], None] | None = None  # called once the process is gone (its socket closed)
        self._proc: _Spawned | _Forked | None = None
        self._reaped = asyncio.Event()  # the process has exited and its exit code is known (or never will be)
        self._channel: FrameProtocol | None = None  # its socket: frames are read as they arrive (_frame, _lost)
        # sent batches, in order: the future of each, and what takes its result in the read callback (``send``)
        self._pending: collections.deque[tuple[asyncio.Future[Message], Callable[[Result], None] | None]] = (
            collections.deque()
        )
        self._ready: asyncio.Future[Message] | None = None
        self.on_partial: Callable[[Partial], None] | None = None  # set by the pool while a batch runs
        self.exited = asyncio.Event()

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._proc.gone and not self.exited.is_set()

    async def _launch(self, child: socket.socket) -> _Spawned | _Forked:
        if self.parent is None:
            return _Spawned(spawn("servetune.server.worker", child.fileno(), self.env))
        pid, pidfd = await self.parent.fork(child)
        return _Forked(pid, pidfd, self.parent)

    async def start(self, timeout: float) -> None:
        """Spawn (or fork) the process and wait until its model is loaded. Raises ParentUnavailable, before any
        process exists, when its parent cannot fork it."""
        loop = asyncio.get_running_loop()
        spawned = time.perf_counter()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = await self._launch(child)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.pid = self._proc.pid
        self._proc.watch(loop, self._reaped.set, f"worker-{self.worker_id}")
        try:
            message = await self._load(loop, parent, timeout)
        except BaseException:
            # Whatever stopped the start (a load error, a timeout, a cancelled scale), no process is left behind, and
            # its exit is not reported to a future nobody waits for any more.
            if self._ready is not None and not self._ready.done():
                self._ready.cancel()
            self.kill()
            if self._channel is None:
                parent.close()
            raise
        self.load_ms = message.load_ms
        self.cpu = message.cpu
        self.metadata = message.metadata
        total = (time.perf_counter() - spawned) * 1000.0
        if self.parent is not None:
            startup_log.debug(
                "start-up: model %s worker %s (pid %s) ready %.0f ms after its fork request (forked from the model's "
                "parent, pid %s: %s), its own load %.0f ms",
                self.spec.model_name,
                self.worker_id,
                self.pid,
                total,
                self.parent.pid,
                "the model loaded" if self.parent.level == "model" else "the handler's modules imported",
                message.load_ms,
            )
            return
        startup_log.debug(
            "start-up: model %s worker %s (pid %s) ready %.0f ms after spawn: interpreter %.0f ms, servetune imports "
            "%.0f ms, handler import and model load %.0f ms, the rest (spawn, messages) %.0f ms",
            self.spec.model_name,
            self.worker_id,
            self.pid,
            total,
            message.interpreter_ms,
            message.imports_ms,
            message.load_ms,
            max(0.0, total - message.interpreter_ms - message.imports_ms - message.load_ms),
        )

    async def _load(self, loop: asyncio.AbstractEventLoop, parent: socket.socket, timeout: float) -> Ready:
        """Send the spec, wait for the worker's answer."""
        self._ready = loop.create_future()
        made = await loop.create_unix_connection(lambda: FrameProtocol(self._frame, self._lost), sock=parent)
        self._channel = made[1]
        self._channel.send(Load(self.spec).encode())
        try:
            message = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            raise WorkerTimeout(f"worker did not load its model within {timeout:g} s") from None
        except WorkerDied:
            await self.wait_reaped(5.0)
            raise WorkerLoadError(f"worker process exited while loading ({self.exit_description()})") from None
        if isinstance(message, LoadError):
            await self.wait_exit(5.0)
            raise WorkerLoadError(message.message)
        if not isinstance(message, Ready):
            raise WorkerLoadError(f"worker sent {type(message).__name__} before it was ready")
        return message

    def _frame(self, header: dict[str, Any], blobs: list[bytes]) -> None:
        """A frame from the worker, in the loop's read callback: a Partial goes to the running batch's stream; any
        other message answers whoever waits (the start, else the batch). ProtocolError: not a message."""
        message = decode_message(header, blobs)
        if isinstance(message, Partial):
            if self.on_partial is not None:
                self.on_partial(message)
            return
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(message)
        elif self._pending:  # the oldest batch sent: the worker answers them in order
            target, now = self._pending.popleft()
            if not target.done():  # a waiter gone (timed out, cancelled) still took its place in the order
                if now is not None and isinstance(message, Result):
                    now(message)
                target.set_result(message)

    def _lost(self, error: BaseException | None) -> None:
        """The socket closed (the process is gone or going, or sent a malformed frame): fail whoever waits, report
        the exit, and make sure the process goes."""
        if isinstance(error, ProtocolError):
            died = WorkerDied(f"worker {self.worker_id} sent a malformed frame: {error}")
        else:
            died = WorkerDied(f"worker {self.worker_id} (pid {self.pid}) died")
        for fut in (self._ready, *(pending for pending, _ in self._pending)):
            if fut is not None and not fut.done():
                fut.set_exception(died)
        self._pending.clear()
        self.exited.set()
        if self.on_exit is not None:
            self.on_exit()
        if self._proc is not None and not self._proc.gone:
            self.kill()  # reaped by its watcher (_reaped)

    async def send(
        self, batches: list[Predict], now: Sequence[Callable[[Result], None] | None] | None = None
    ) -> list[asyncio.Future[Message]]:
        """Send ``batches`` in one write; a future per batch, answered in order as the worker finishes each.
        ``now``: for each batch, a function given its result in the loop's read callback, before its future is
        answered with the same result (the requests' answers can then go out in the turn that read it, not in the
        turns after it when the waiter resumes); it must not raise. Not called for a batch whose waiter gave up (a
        timeout, a cancel), nor with anything but a ``Result``."""
        sent = self.send_now(batches, now)
        await self.drain()
        return sent

    def send_now(
        self, batches: list[Predict], now: Sequence[Callable[[Result], None] | None] | None = None
    ) -> list[asyncio.Future[Message]]:
        """``send`` without waiting for the write to drain (``drain``): from a callback of the loop."""
        channel = self._channel
        if not self.alive or channel is None:
            raise WorkerDied(f"worker {self.worker_id} is not running")
        loop = asyncio.get_running_loop()
        sent = [loop.create_future() for _ in batches]
        try:
            channel.send(batches[0].encode() if len(batches) == 1 else b"".join(b.encode() for b in batches))
        except (ConnectionError, RuntimeError) as exc:  # nothing was written: none of them reached the worker
            raise WorkerDied(f"worker {self.worker_id} (pid {self.pid}) is gone: {exc}") from None
        self._pending.extend(zip(sent, now or [None] * len(sent), strict=True))
        return sent

    async def drain(self) -> None:
        """Wait while the socket's write buffer is full. Gone while the write drained: the worker may have run some
        of the batches sent, and the loss answered the rest (WorkerDied, ``_lost``); each batch's future says which."""
        if self._channel is not None:
            with contextlib.suppress(ConnectionError):
                await self._channel.drain()

    async def result(self, pending: asyncio.Future[Message], timeout: float) -> Result:
        """Wait for a sent batch's result, at most ``timeout`` seconds from now."""
        # One timer per batch rather than wait_for(shield(...)), which makes two tasks and a future per batch.
        timer = asyncio.get_running_loop().call_later(timeout, self._overran, pending, timeout)
        try:
            message = await pending
        finally:
            timer.cancel()
        if not isinstance(message, Result):
            raise WorkerDied(f"worker {self.worker_id} answered a batch with {type(message).__name__}")
        self.gpu_memory_bytes = message.gpu_memory_bytes
        if message.cpu is not None:
            self.cpu = message.cpu
        return message

    def _overran(self, pending: asyncio.Future[Message], timeout: float) -> None:
        if not pending.done():
            pending.set_exception(WorkerTimeout(f"worker {self.worker_id} took longer than {timeout:g} s"))

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()

    async def wait_reaped(self, timeout: float) -> None:
        """Wait until the process is gone and its exit code known (at most ``timeout`` seconds)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._reaped.wait(), timeout)

    def exit_description(self) -> str:
        """``exit code 3``, ``killed by SIGSEGV``, ``still running``, or that its exit code is not known (a forked
        worker whose parent died before it)."""
        if self._proc is None or not self._proc.gone:
            return "still running"
        if self._proc.returncode is None:
            return "exit code not known (its parent process is gone)"
        return describe_exit(self._proc.returncode)

    async def wait_exit(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.exited.wait(), timeout)

    async def stop(self, grace: float = 5.0) -> None:
        """Close the socket (the worker exits on EOF), then kill it if it lingers."""
        if self._channel is not None:
            self._channel.close()
        if self._proc is not None and not self._reaped.is_set():
            try:
                await asyncio.wait_for(self._reaped.wait(), grace)
            except TimeoutError:
                self.kill()
                await self._reaped.wait()
        if self._channel is not None:
            await self.exited.wait()  # the socket's close has been seen (_lost ran)

    def memory(self) -> tuple[int, int | None]:
        """(RSS, PSS) in bytes (PSS None where the kernel does not tell); (0, None) before it starts."""
        if self.pid is None:
            return 0, None
        return process_memory(self.pid)


__all__ = ["WorkerProcess"]
