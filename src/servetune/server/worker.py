"""The worker process: loads one model with its handler, then runs batches sent by the frontend.

Started by the frontend as ``python -m servetune.server.worker FD SPEC_JSON`` (a fresh interpreter, like
multiprocessing's spawn), with one end of a socket pair inherited as file descriptor FD. It exits when the
frontend closes the socket or dies.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from servetune.server.protocol import recv_frame, send_frame


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


def _load(spec: dict[str, Any]) -> Any:
    import torch

    if spec.get("num_threads"):
        torch.set_num_threads(int(spec["num_threads"]))
    from servetune.handlers.service import load_service

    return load_service(
        model_dir=Path(spec["model_dir"]),
        manifest=spec["manifest"],
        model_name=spec["model_name"],
        gpu_id=spec.get("gpu_id"),
        batch_size=int(spec["batch_size"]),
        model_yaml_config=spec.get("model_yaml_config") or {},
        limit_max_image_pixels=bool(spec.get("limit_max_image_pixels", True)),
        decode_input_request=bool(spec.get("decode_input_request", True)),
    )


def _serve(sock: socket.socket, service: Any) -> None:
    from servetune.handlers.service import InputParam, Request

    while True:
        try:
            header, blobs = recv_frame(sock)
        except EOFError:
            return
        if header.get("type") != "predict":
            continue
        if "batch_size" in header:  # the frontend may change it in place (PUT /models/{name}?batch_size=)
            service.context.system_properties["batch_size"] = int(header["batch_size"])
        threads = header.get("num_threads")
        if threads and (torch := sys.modules.get("torch")) is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(int(threads))  # the frontend shares the cores anew after scaling
        requests = []
        blob_iter = iter(blobs)
        for item in header["batch"]:
            inputs = [
                InputParam(name=p["name"], content_type=p.get("ctype"), data=next(blob_iter)) for p in item["inputs"]
            ]
            requests.append(Request(request_id=item["id"], headers=item.get("headers", {}), inputs=inputs))
        start = time.perf_counter()
        responses = service.predict(requests)
        handler_ms = (time.perf_counter() - start) * 1000.0
        items = [{"status": r.status, "ctype": r.content_type, "headers": r.headers} for r in responses]
        header = {"type": "result", "handler_ms": handler_ms, "items": items, "gpu_memory": _gpu_memory()}
        send_frame(sock, header, [r.body for r in responses])


def _gpu_memory() -> int:
    """Bytes of GPU memory this process's caching allocator holds at most so far (0 when CUDA is unused)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0
    return int(torch.cuda.max_memory_reserved())


def main(argv: list[str]) -> int:
    fd, spec = int(argv[1]), json.loads(argv[2])
    _die_with_parent()
    # The frontend owns shutdown: ignore Ctrl-C sent to the whole process group, exit on SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    start = time.perf_counter()
    try:
        service = _load(spec)
    except BaseException as exc:  # any load failure is reported to the frontend, verbatim
        message = f"{type(exc).__name__}: {exc}"
        send_frame(sock, {"type": "load_error", "message": message, "traceback": traceback.format_exc()})
        return 1
    send_frame(sock, {"type": "ready", "pid": os.getpid(), "load_ms": (time.perf_counter() - start) * 1000.0})
    _serve(sock, service)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
