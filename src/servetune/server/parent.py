"""A model's parent process as the frontend sees it (:class:`ModelParent`), and when a model's workers are forked
from one (:class:`Forking`).

The parent (``servetune.server.forkserver``) is a fresh interpreter, started without forking the frontend, that
loads the model once (or imports its handler's modules) and forks the model's workers: they share its pages
copy-on-write — torch's own ~290 MB of private memory per process with torch 2.14, and the model — and start in
milliseconds instead of importing torch each. Each worker is still its own process with its own socket to the
frontend; only its parent differs. The frontend talks to the parent over a socket pair (``fork_messages``): it sends
the worker's end of a fresh socket pair with each ``Fork`` and gets back the worker's pid and a pidfd of it, through
which it signals that worker (never a reused pid) and sees it exit; the parent, which reaps it, reports its exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from servetune._exceptions import ParentUnavailable, WorkerLoadError, WorkerTimeout
from servetune.handlers.loader import heavy_imports
from servetune.handlers.spec import WorkerSpec
from servetune.hardware import process_memory
from servetune.server import early
from servetune.server.early import parent_environment
from servetune.server.fork_messages import Exited, Fork, Forked, ForkMessage, Preload, Preloaded, decode_fork_message
from servetune.server.messages import FrameBuffer, LoadError, ProtocolError, recv_chunk
from servetune.server.spawn import describe_exit, pidfd_supported, spawn, watch_exit
from servetune.startup import CLOCK
from servetune.startup import log as startup_log

log = logging.getLogger("servetune.pool")

FORK_TIMEOUT_S = 30.0  # a fork and its answer take milliseconds; past this the parent is stuck
PARENT_DEATHS = 3  # a model whose parent died this often starts its workers without one


def fork_key(spec: WorkerSpec, level: str) -> dict[str, Any]:
    """What a parent preloaded at ``level``: the spec without what each worker sets for itself after the fork (and,
    for a parent that only imported the handler, without what only loading the model reads: a batch size changed in
    place does not make it stale)."""
    own = replace(spec, gpu_id=None, num_threads=0, inter_op_threads=0, cpu_cores=())
    if level == "imports":
        return {"model_name": own.model_name, "model_dir": own.model_dir, "manifest": own.manifest}
    return own.to_json()


class ModelParent:
    """One parent process of one model version: ``start`` (it preloads), ``fork`` workers, ``stop``."""

    def __init__(self, model_name: str, spec: WorkerSpec, level: str, env: dict[str, str]) -> None:
        self.model_name = model_name
        self.spec = spec
        self.level = level
        self.env = parent_environment(env)
        self.key = fork_key(spec, level)
        self.pid: int | None = None
        self.preloaded: Preloaded | None = None
        self.gone = asyncio.Event()  # its socket closed: it forks no more workers
        self.failed = False  # counted as a failure of the model's parents (``Forking.lost``)
        self.retiring = False  # forks no more; stops once its workers have exited
        self._children: set[int] = set()  # the workers it forked that have not exited
        self._stopping: asyncio.Task[None] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaped = asyncio.Event()
        self._sock: socket.socket | None = None
        self._frames = FrameBuffer()
        self._sending = asyncio.Lock()  # one frame at a time on the socket
        self._ready: asyncio.Future[ForkMessage] | None = None
        self._forks: dict[int, asyncio.Future[tuple[int, int]]] = {}  # Fork seq -> (pid, pidfd)
        self._exits: dict[int, asyncio.Future[int | None]] = {}  # worker pid -> exit code (None: never to be known)
        self._seq = 0

    @property
    def alive(self) -> bool:
        return self._sock is not None and not self.gone.is_set() and not self._reaped.is_set()

    # ---- life ------------------------------------------------------------------------------------

    async def start(self, timeout: float) -> Preloaded:
        """Start the parent and wait until it has preloaded. Raises WorkerLoadError (the handler's own message) or
        WorkerTimeout as a worker would, ParentUnavailable if it died or found that it must not fork (``hazard``)."""
        loop = asyncio.get_running_loop()
        # a start-up model's parent may have started before the frontend's own imports (servetune.server.early)
        started_early = early.claim(self.model_name, self.env)
        if started_early is not None:
            self._proc, mine, spawned = started_early.proc, started_early.sock, started_early.spawned
        else:
            spawned = time.perf_counter()
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._proc = spawn("servetune.server.forkserver", theirs.fileno(), self.env)
            except BaseException:
                mine.close()
                raise
            finally:
                theirs.close()
        self.pid = self._proc.pid
        watch_exit(loop, self._proc, self._reaped.set, f"parent-{self.model_name}")
        mine.setblocking(False)
        self._sock = mine
        loop.add_reader(mine.fileno(), self._readable)
        self._ready = loop.create_future()
        try:
            await self._send(Preload(self.spec, self.level).encode())
            message = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            await self.stop(0.0)
            raise WorkerTimeout(f"the model's parent process did not load it within {timeout:g} s") from None
        except ParentUnavailable:
            await self.wait_reaped(5.0)
            code = self._proc.returncode
            raise ParentUnavailable(
                f"the model's parent process exited while loading ({describe_exit(code)})"
            ) from None
        except BaseException:
            await self.stop(0.0)
            raise
        if isinstance(message, LoadError):
            await self.stop()
            raise WorkerLoadError(message.message)
        if not isinstance(message, Preloaded):
            await self.stop(0.0)
            raise ParentUnavailable(f"the model's parent process sent {type(message).__name__} before Preloaded")
        if message.hazard:
            await self.stop()
            raise ParentUnavailable(message.hazard, hazard=True)
        self.preloaded = message
        startup_log.debug(
            "start-up: model %s parent (pid %s) preloaded (%s) %.0f ms after spawn%s: interpreter %.0f ms, servetune "
            "imports %.0f ms, early imports (%s) %.0f ms, %s %.0f ms; torch %s",
            self.model_name,
            self.pid,
            self.level,
            (time.perf_counter() - spawned) * 1000.0,
            f" (spawned {(spawned - time.perf_counter()) * 1000.0 + CLOCK.since_exec_ms():.0f} ms after exec)",
            message.interpreter_ms,
            message.imports_ms,
            ", ".join(started_early.modules) if started_early is not None else "none",
            message.early_ms,
            "handler import and model load" if self.level == "model" else "handler import",
            message.load_ms,
            "loaded" if message.torch else "not loaded",
        )
        return message

    async def stop(self, grace: float = 5.0) -> None:
        """Close the socket (the parent exits on EOF), kill it if it lingers. Its workers go on."""
        self._lost("stopped")
        if self._proc is None or self._proc.returncode is not None:
            return
        try:
            await asyncio.wait_for(self._reaped.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._reaped.wait()

    def retire(self) -> None:
        """Fork no more, and stop once the workers it forked have exited: stopped now, it would orphan them (their
        exit codes lost, and nobody to reap them where the frontend is the PID 1 of a container)."""
        self.retiring = True
        if not self._children:
            self._stop_soon()

    def _stop_soon(self) -> None:
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(self.stop(), name=f"parent-{self.pid}-stop")

    async def wait_reaped(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._reaped.wait(), timeout)

    def kill(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    def memory(self) -> tuple[int, int | None]:
        """(RSS, PSS) in bytes of the parent process; (0, None) when it is not running."""
        if self.pid is None or not self.alive:
            return 0, None
        return process_memory(self.pid)

    # ---- forking ---------------------------------------------------------------------------------

    async def fork(self, sock: socket.socket) -> tuple[int, int]:
        """Fork a worker whose end of its socket pair is ``sock``: (its pid, a pidfd of it, which the caller owns).
        Raises ParentUnavailable when the parent is gone or cannot fork (the caller spawns the worker instead)."""
        if not self.alive or self.retiring:
            raise ParentUnavailable(f"the model's parent process (pid {self.pid}) is gone or retiring")
        self._seq += 1
        seq = self._seq
        forked: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._forks[seq] = forked
        try:
            await self._send(Fork(seq).encode(), [sock.fileno()])
            return await asyncio.wait_for(asyncio.shield(forked), FORK_TIMEOUT_S)
        except TimeoutError:
            raise ParentUnavailable(f"the model's parent process did not fork within {FORK_TIMEOUT_S:g} s") from None
        finally:
            # An answer that comes after the caller stopped waiting finds no waiter: that worker is killed.
            self._forks.pop(seq, None)

    async def exit_code(self, pid: int, timeout: float) -> int | None:
        """The exit code of worker ``pid`` as the parent reports it (it reaps its workers); None if it never will (it
        is gone) or does not within ``timeout`` seconds."""
        future = self._exits.get(pid)
        if future is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            return None
        finally:
            if future.done():
                self._exits.pop(pid, None)

    # ---- the socket ------------------------------------------------------------------------------

    async def _send(self, frame: bytes, fds: list[int] | None = None) -> None:
        async with self._sending:
            view = memoryview(frame)
            while view:
                sock = self._sock
                if sock is None:
                    raise ParentUnavailable(f"the model's parent process (pid {self.pid}) is gone")
                try:
                    sent = socket.send_fds(sock, [view], fds) if fds else sock.send(view)
                except BlockingIOError:
                    await self._writable(sock)
                    continue
                except OSError as exc:
                    self._lost(str(exc))
                    raise ParentUnavailable(f"the model's parent process (pid {self.pid}) is gone: {exc}") from None
                fds = None  # they went with the first bytes
                view = view[sent:]

    @staticmethod
    async def _writable(sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def writable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_writer(sock.fileno(), writable)
        try:
            await ready
        finally:
            loop.remove_writer(sock.fileno())

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            data, fds = recv_chunk(sock)
        except BlockingIOError:
            return
        except (OSError, ProtocolError) as exc:
            self._lost(str(exc))
            return
        if not data:
            self._lost("it closed its socket")
            return
        self._frames.feed(data, fds)
        try:
            while (frame := self._frames.next_frame()) is not None:
                header, blobs, fds = frame
                self._dispatch(decode_fork_message(header, blobs), fds)
        except ProtocolError as exc:
            log.error("model %s: its parent process sent a malformed frame: %s", self.model_name, exc)
            self._lost(str(exc))

    def _dispatch(self, message: ForkMessage, fds: list[int]) -> None:
        if isinstance(message, Forked):
            waiter = self._forks.get(message.seq)
            if message.error:
                if waiter is not None and not waiter.done():
                    waiter.set_exception(ParentUnavailable(message.error))
                return
            [pidfd] = fds
            self._exits[message.pid] = asyncio.get_running_loop().create_future()
            self._children.add(message.pid)
            if waiter is None or waiter.done():  # nobody waits for this worker any more (a cancelled start)
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                os.close(pidfd)
                return
            waiter.set_result((message.pid, pidfd))
        elif isinstance(message, Exited):
            future = self._exits.setdefault(message.pid, asyncio.get_running_loop().create_future())
            if not future.done():
                future.set_result(message.returncode)
            self._children.discard(message.pid)
            if self.retiring and not self._children:
                self._stop_soon()
        elif isinstance(message, Preloaded | LoadError):
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message)
        else:
            for fd in fds:
                os.close(fd)

    def _lost(self, reason: str) -> None:
        """The socket is closed (by either side): everyone waiting on the parent is told, once."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(sock.fileno())
        sock.close()
        self._frames.close()
        self.gone.set()
        error = ParentUnavailable(f"the model's parent process (pid {self.pid}) is gone: {reason}")
        for waiter in (self._ready, *self._forks.values()):
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)
        for future in self._exits.values():
            if not future.done():
                future.set_result(None)  # its workers live on; their exit codes will not be known


class Forking:
    """Whether a model's workers are forked from a parent, and the parent they are forked from: started on the first
    worker's start, kept while the model has workers (a replaced worker forks in milliseconds), replaced when what it
    loaded no longer matches (the batch size or configuration changed), restarted if it dies, given up for plain
    spawning after it died :data:`PARENT_DEATHS` times or could not fork safely.

    ``setting`` is model-config.yaml's ``workerPreload`` (or the server's ``worker_preload``): ``auto`` forks from a
    parent that loaded the model when the model's code uses torch (``heavy_imports``) or when its online controller
    moves its workers (``scales``: a worker spawned takes ~150 ms of a core to start, at the moment the load rises;
    one forked, ~6 ms), ``model`` always does,
    ``imports`` from one that imported the handler's modules only (each worker then loads the model itself), ``off``
    never. On a GPU the parent only imports (CUDA must never start in it); a model whose load leaves threads or files
    behind falls back to ``imports``, and one whose imports do to no parent."""

    def __init__(
        self, model_name: str, setting: str, model_dir: Path, manifest: dict[str, Any], scales: bool = False
    ) -> None:
        self.model_name = model_name
        self.setting = setting
        self.scales = scales
        self.model_dir = model_dir
        self.manifest = manifest
        self.parent: ModelParent | None = None
        self.disabled = "" if setting != "off" else "workerPreload is off"  # why workers start without a parent
        self._heavy: str | None | bool = False  # False: not decided yet
        self._levels_refused: set[str] = set()
        self._deaths = 0
        self._lock = asyncio.Lock()
        self._starting: ModelParent | None = None
        self._retired: set[ModelParent] = set()  # replaced, waiting for their workers to exit
        self._closed = False  # the model is unregistered: no parent any more
        self._pidfds = pidfd_supported()

    async def _level(self, spec: WorkerSpec) -> str | None:
        if self.disabled:
            return None
        if self.setting == "auto":
            if self._heavy is False:
                self._heavy = await asyncio.to_thread(heavy_imports, self.manifest, self.model_dir)
            if self._heavy is None and not self.scales:
                self.disabled = "its code imports nothing heavy (workerPreload auto)"
                startup_log.debug(
                    "start-up: model %s: workers start without a parent: %s", self.model_name, self.disabled
                )
                return None
        if not self._pidfds:
            self.disabled = "this kernel has no pidfds"
            return None
        level = "imports" if self.setting == "imports" or spec.gpu_id is not None else "model"
        if level in self._levels_refused:
            level = "imports"
        return None if level in self._levels_refused else level

    async def parent_for(self, spec: WorkerSpec, env: dict[str, str], timeout: float) -> ModelParent | None:
        """The parent to fork a worker of ``spec`` from, started if need be; None: spawn the worker. Raises
        WorkerLoadError or WorkerTimeout when the parent could not load the model (a worker could not either)."""
        async with self._lock:
            while not self._closed:
                level = await self._level(spec)
                parent = self.parent
                if parent is not None and not parent.alive:  # it died since the last start (killed, crashed)
                    await self.lost(parent, ParentUnavailable(f"the model's parent process (pid {parent.pid}) died"))
                    continue
                if (
                    parent is not None
                    and level is not None
                    and parent.level == level
                    and parent.key == fork_key(spec, level)
                ):
                    return parent
                self._retire_parent()  # stale (what it loaded changed) or no longer wanted
                if level is None:
                    return None
                parent = self._starting = ModelParent(self.model_name, spec, level, env)
                try:
                    await parent.start(timeout)
                except ParentUnavailable as exc:
                    if self._closed:
                        return None
                    if exc.hazard:
                        self._levels_refused.add(level)
                        log.warning(
                            "model %s: its workers cannot be forked from a parent that %s: %s",
                            self.model_name,
                            "loaded the model" if level == "model" else "imported its handler",
                            exc,
                        )
                        continue  # the next level down, or none
                    await self.lost(parent, exc)
                    return None
                finally:
                    self._starting = None
                self.parent = parent
                return parent
            return None

    async def lost(self, parent: ModelParent | None, exc: BaseException) -> None:
        """``parent`` died (or could not fork): the worker starting now is spawned, the next start gets a new parent
        unless this happened :data:`PARENT_DEATHS` times. Once per parent, whoever notices first."""
        if parent is None or parent.failed:
            return
        parent.failed = True
        if parent is self.parent:
            self._retire_parent()  # alive but unable to fork: it goes once its workers have
        else:
            await parent.stop(0.0)
        self._deaths += 1
        if self._deaths >= PARENT_DEATHS:
            self.disabled = f"its parent process failed {self._deaths} times, the last: {exc}"
            log.error("model %s: workers start without a parent from now on: %s", self.model_name, self.disabled)
        else:
            log.warning("model %s: its parent process failed: %s", self.model_name, exc)

    def _retire_parent(self) -> None:
        parent, self.parent = self.parent, None
        self._retired = {p for p in self._retired if not p.gone.is_set()}  # those that stopped by themselves
        if parent is not None:
            self._retired.add(parent)
            parent.retire()

    def parents(self) -> list[tuple[str, ModelParent]]:
        """The running parents with a name for each: ``parent`` (the one workers fork from), ``parent-PID`` (replaced,
        until its last worker exits)."""
        named = [("parent", self.parent)] if self.parent is not None and self.parent.alive else []
        return named + [(f"parent-{p.pid}", p) for p in self._retired if p.alive]

    async def close(self, final: bool = False) -> None:
        """Stop the parents: the model has no worker any more (scaled to 0), or (``final``) it is unregistered, and a
        parent starting now is stopped too."""
        self._closed = self._closed or final
        parents = {p for p in (self.parent, *self._retired) if p is not None}
        self.parent = None
        self._retired.clear()
        if final and self._starting is not None:
            await self._starting.stop(0.0)  # its start raises; the worker start that waits for it finds the pool closed
        await asyncio.gather(*(p.stop() for p in parents))


__all__ = ["FORK_TIMEOUT_S", "Forking", "ModelParent", "fork_key", "parent_environment"]
