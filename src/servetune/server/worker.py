"""The worker process: loads one model with its handler, then runs batches sent by the frontend.

Started by the frontend as ``python -m servetune.server.worker FD`` (a fresh interpreter, like multiprocessing's
spawn), with one end of a socket pair inherited as file descriptor FD, or forked by its model's parent process
(``servetune.server.forkserver``, which calls :func:`forked_main`), with the model's imports, or the whole model,
already loaded. Either way the first frame on the socket is a ``Load`` (the ``servetune.handlers.spec.WorkerSpec``:
over the socket, as a spec may be larger than a command line can be). It exits when the frontend closes the socket or
dies.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

from servetune.handlers.service import Request, Service
from servetune.handlers.spec import WorkerSpec, apply_cpu, cpu_settings, prepare_cpu, start_service
from servetune.server.batch_memory import BatchMemory
from servetune.server.messages import (
    Answer,
    Load,
    LoadError,
    Partial,
    Predict,
    ProtocolError,
    Ready,
    Result,
    SocketFrames,
    decode_message,
)
from servetune.startup import CLOCK, freeze_heap


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL us when the frontend dies, and poll as a fallback elsewhere."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _serve(sock: socket.socket, frames: SocketFrames, service: Service, spec: WorkerSpec) -> None:
    applied = (spec.num_threads, spec.cpu_cores)
    cpu = cpu_settings()
    memory = BatchMemory.tuned()  # a batch's memory kept for the next while batches come, given back at idle
    sending = threading.Lock()  # a handler may send intermediate answers from threads of its own

    def send(frame: bytes) -> None:
        with sending:
            sock.sendall(frame)

    def partial(request_id: str, status: int, body: bytes, content_type: str | None) -> None:
        send(Partial(request_id, Answer(status, body, content_type, {})).encode())

    service.context.partial_sink = partial
    while True:
        try:
            message = decode_message(*frames.next())
        except EOFError:
            return
        if not isinstance(message, Predict):
            continue
        # the frontend may change these in place (PUT /models/{name}?batch_size=&num_threads=&cpu_pinning=)
        service.context.system_properties["batch_size"] = message.batch_size
        if (message.num_threads, message.cpu_cores) != applied:
            apply_cpu(message.num_threads, message.cpu_cores)
            applied = (message.num_threads, message.cpu_cores)
            cpu = cpu_settings()
        requests = [Request(r.request_id, r.headers, r.inputs, r.control) for r in message.requests]
        if memory is not None:
            memory.batch_started()
        start = time.perf_counter()
        responses = service.predict(requests)
        handler_ms = (time.perf_counter() - start) * 1000.0
        answers = [Answer(r.status, r.body, r.content_type, r.headers) for r in responses]
        send(Result(answers, handler_ms, _gpu_memory(), cpu).encode())
        if memory is not None:
            memory.batch_ran()


def _gpu_memory() -> int:
    """Bytes of GPU memory this process's caching allocator holds at most so far (0 when CUDA is unused)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0
    return int(torch.cuda.max_memory_reserved())


def _exit_with_frontend(frontend: int) -> None:
    """A forked worker's parent is its model's parent process, not the frontend, so PDEATHSIG would fire when that
    one dies (and the workers must outlive it). It watches the frontend itself: ``frontend`` is a pidfd of it, which
    turns readable the moment the frontend exits, even by SIGKILL."""

    def watch() -> None:
        select.select([frontend], [], [])
        os._exit(1)

    threading.Thread(target=watch, name="frontend-watchdog", daemon=True).start()


def ignore_group_signals() -> None:
    """The frontend owns shutdown: ignore Ctrl-C and SIGTERM sent to the whole process group (a terminal, systemd's
    control-group stop), so that in-flight batches finish while it drains; it stops a worker by closing the socket and
    kills one with SIGKILL, and a worker whose frontend is gone exits (PDEATHSIG, or a watch of the frontend)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _run(
    sock: socket.socket, preloaded: Service | None, interpreter_ms: float, imports_ms: float, *, forked: bool = False
) -> int:
    """Take the ``Load``, load the model (or adopt the one the parent loaded), answer ``Ready``, serve."""
    frames = SocketFrames(sock)
    try:
        frame = frames.next()
    except EOFError:
        return 1  # the frontend gave up on this worker before it sent the spec
    start = time.perf_counter()
    try:
        load = decode_message(*frame)
        if not isinstance(load, Load):
            raise ProtocolError(f"expected the Load message first, got {type(load).__name__}")
        spec = load.spec
        if forked and spec.num_threads:  # the environment a spawned worker gets (the parent's said 1 thread)
            os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(spec.num_threads)
        if preloaded is None:
            service = start_service(spec)
        elif preloaded.context.model_name != spec.model_name:
            raise ProtocolError(f"this worker holds model {preloaded.context.model_name}, not {spec.model_name}")
        else:
            prepare_cpu(spec)  # the parent ran with one thread: this worker's own threads and cores
            service = preloaded
    except BaseException as exc:  # any load failure is reported to the frontend, verbatim
        sock.sendall(LoadError(f"{type(exc).__name__}: {exc}", traceback.format_exc()).encode())
        return 1
    load_ms = (time.perf_counter() - start) * 1000.0
    # the interpreter, the handler's imports and the model out of the collector's full passes: a full pass over a
    # torch worker's heap stops its batch for 100 ms or more (no collection first: that would cost as much, once)
    freeze_heap(collect=False)
    ready = Ready(os.getpid(), load_ms, cpu_settings(), interpreter_ms, imports_ms, service.metadata)
    sock.sendall(ready.encode())
    _serve(sock, frames, service, spec)
    return 0


def forked_main(fd: int, frontend: int, preloaded: Service | None) -> int:
    """A worker forked by its model's parent (``servetune.server.forkserver``): ``fd`` its end of the socket pair,
    ``frontend`` a pidfd of the frontend, ``preloaded`` the model when the parent loaded it (else the parent imported
    the handler's modules only, and this worker loads the model as a spawned one does)."""
    _exit_with_frontend(frontend)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # its global generator was seeded in the parent: fresh entropy, as a new process
        numpy_random.seed()
    return _run(socket.socket(fileno=fd), preloaded, 0.0, 0.0, forked=True)


def main(argv: list[str]) -> int:
    imports_ms = CLOCK.lap_ms()  # since servetune was first imported: the worker's imports
    fd = int(argv[1])
    _die_with_parent()
    ignore_group_signals()
    return _run(socket.socket(fileno=fd), None, CLOCK.interpreter_ms, imports_ms)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
