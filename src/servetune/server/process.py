"""One worker process as the frontend sees it: spawn, wait for ready, run a batch, notice death at once.

A worker is a fresh interpreter started with ``subprocess.Popen`` (vfork + exec on Linux: between the two the child
runs only the C code that sets up its file descriptors, and no fork handler of any library). Not asyncio's
``create_subprocess_exec``: under uvloop that is libuv's ``uv_spawn``, a real ``fork()`` of the frontend, which runs
gRPC's and Python's fork handlers in a copy of a process whose gRPC threads were busy — the child then crashed
(SIGSEGV or SIGABRT in gRPC's ``event_engine``) before it could exec: 7 of 200 worker starts beside busy gRPC servers
(``benchmarks/grpc_scaling.py``).
Its exit is watched through a pidfd (a thread where there is none). Its :class:`WorkerSpec` goes over the socket as
the first frame (:class:`Load`), never on its command line, which has a size limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from servetune._exceptions import WorkerDied, WorkerLoadError, WorkerTimeout
from servetune.handlers.spec import CpuSettings, WorkerSpec
from servetune.hardware import process_memory
from servetune.server.messages import Load, LoadError, Message, Partial, Predict, Ready, Result, decode_message
from servetune.server.protocol import ProtocolError, read_frame
from servetune.startup import log as startup_log


def spawn_worker(fd: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python -m servetune.server.worker FD``, inheriting ``fd`` (its end of the socket pair) and no other file."""
    return subprocess.Popen(
        [sys.executable, "-m", "servetune.server.worker", str(fd)],
        pass_fds=(fd,),
        env=env,
        stdin=subprocess.DEVNULL,
        close_fds=True,
    )


class WorkerProcess:
    """A spawned worker. One batch at a time; the caller serialises ``run`` calls."""

    def __init__(self, worker_id: str, spec: WorkerSpec, env: dict[str, str]) -> None:
        self.worker_id = worker_id
        self.spec = spec
        self.env = env
        self.pid: int | None = None
        self.start_time = time.time()
        self.gpu_id: int | None = spec.gpu_id
        self.load_ms = 0.0
        self.gpu_memory_bytes = 0  # peak GPU memory reserved, as of its last batch
        self.cpu: CpuSettings | None = None  # as the worker last reported them
        self.metadata: dict[str, Any] | None = None  # the handler's OIP metadata, as the worker reported it loaded
        self.on_exit: Callable[[], None] | None = None  # called once the process is gone (its socket closed)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaped = asyncio.Event()  # the process has exited and was reaped (its returncode is set)
        self._writer: asyncio.StreamWriter | None = None
        self._pending: asyncio.Future[Message] | None = None
        self._ready: asyncio.Future[Message] | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self.on_partial: Callable[[Partial], None] | None = None  # set by the pool while a batch runs
        self.exited = asyncio.Event()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and not self.exited.is_set()

    async def start(self, timeout: float) -> None:
        """Spawn the process and wait until its model is loaded."""
        loop = asyncio.get_running_loop()
        spawned = time.perf_counter()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = spawn_worker(child.fileno(), self.env)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.pid = self._proc.pid
        self._watch_exit(loop, self._proc)
        try:
            message = await self._load(loop, parent, timeout)
        except BaseException:
            # Whatever stopped the start (a load error, a timeout, a cancelled scale), no process is left behind, and
            # its exit is not reported to a future nobody waits for any more.
            if self._ready is not None and not self._ready.done():
                self._ready.cancel()
            self.kill()
            if self._writer is None:
                parent.close()
            raise
        self.load_ms = message.load_ms
        self.cpu = message.cpu
        self.metadata = message.metadata
        total = (time.perf_counter() - spawned) * 1000.0
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
        reader, self._writer = await asyncio.open_unix_connection(sock=parent, limit=1 << 20)
        self._writer.write(Load(self.spec).encode())
        self._ready = loop.create_future()
        self._reader_task = asyncio.create_task(self._read_loop(reader), name=f"worker-{self.worker_id}-reader")
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

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        error: BaseException = WorkerDied(f"worker {self.worker_id} (pid {self.pid}) died")
        try:
            while True:
                message = decode_message(*await read_frame(reader))
                if isinstance(message, Partial):
                    if self.on_partial is not None:
                        self.on_partial(message)
                    continue
                target = self._ready if self._ready is not None and not self._ready.done() else self._pending
                if target is not None and not target.done():
                    target.set_result(message)
        except (asyncio.IncompleteReadError, ConnectionError, ProtocolError) as exc:
            if isinstance(exc, ProtocolError):
                error = WorkerDied(f"worker {self.worker_id} sent a malformed frame: {exc}")
        finally:
            for fut in (self._ready, self._pending):
                if fut is not None and not fut.done():
                    fut.set_exception(error)
            self.exited.set()
            if self.on_exit is not None:
                self.on_exit()
            if self._writer is not None:
                self._writer.close()
            if self._proc is not None and self._proc.returncode is None:
                # The socket closed: the process is gone or going; reap it without blocking the loop.
                self.kill()
                await self._reaped.wait()

    async def run(self, batch: Predict, timeout: float) -> Result:
        """Send one batch and wait for its result."""
        if not self.alive or self._writer is None:
            raise WorkerDied(f"worker {self.worker_id} is not running")
        loop = asyncio.get_running_loop()
        pending = self._pending = loop.create_future()
        try:
            self._writer.write(batch.encode())
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise WorkerDied(f"worker {self.worker_id} (pid {self.pid}) is gone: {exc}") from None
        # One timer per batch rather than wait_for(shield(...)), which makes two tasks and a future per batch.
        timer = loop.call_later(timeout, self._overran, pending, timeout)
        try:
            message = await pending
        finally:
            timer.cancel()
            self._pending = None
        if not isinstance(message, Result):
            raise WorkerDied(f"worker {self.worker_id} answered a batch with {type(message).__name__}")
        self.gpu_memory_bytes = message.gpu_memory_bytes
        if message.cpu is not None:
            self.cpu = message.cpu
        return message

    def _overran(self, pending: asyncio.Future[Message], timeout: float) -> None:
        if not pending.done():
            pending.set_exception(WorkerTimeout(f"worker {self.worker_id} took longer than {timeout:g} s"))

    def _watch_exit(self, loop: asyncio.AbstractEventLoop, proc: subprocess.Popen[bytes]) -> None:
        """Set ``_reaped`` once the process exits: its pidfd turns readable (Linux 5.3+), else a thread waits."""

        def reaped() -> None:
            proc.poll()
            self._reaped.set()

        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # not Linux, or an old kernel
            threading.Thread(
                target=lambda: (proc.wait(), loop.call_soon_threadsafe(reaped)),
                name=f"worker-{self.worker_id}-wait",
                daemon=True,
            ).start()
            return

        def readable() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            reaped()

        loop.add_reader(pidfd, readable)

    def kill(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    async def wait_reaped(self, timeout: float) -> None:
        """Wait until the process is gone and its exit code known (at most ``timeout`` seconds)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._reaped.wait(), timeout)

    def exit_description(self) -> str:
        """``exit code 3``, ``killed by SIGSEGV``, or ``still running``."""
        code = self._proc.returncode if self._proc is not None else None
        if code is None:
            return "still running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
            return f"killed by signal {-code}"
        return f"exit code {code}"

    async def wait_exit(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.exited.wait(), timeout)

    async def stop(self, grace: float = 5.0) -> None:
        """Close the socket (the worker exits on EOF), then kill it if it lingers."""
        if self._writer is not None:
            self._writer.close()
        if self._proc is not None and self._proc.returncode is None:
            try:
                await asyncio.wait_for(self._reaped.wait(), grace)
            except TimeoutError:
                self.kill()
                await self._reaped.wait()
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)

    def memory(self) -> tuple[int, int | None]:
        """(RSS, PSS) in bytes (PSS None where the kernel does not tell); (0, None) before it starts."""
        if self.pid is None:
            return 0, None
        return process_memory(self.pid)


__all__ = ["WorkerProcess"]
