"""Which of servetune's files one request runs through in the server process, traced (docs/architecture.md, "A
request, file by file").

A native server runs in this process (its worker is a process of its own, not traced) with one no-op model; after a
few warm-up requests, one request of each protocol is traced with a profiler hook on the server's event loop and its
threads, and every servetune file a call entered is listed with its number of calls.

    python benchmarks/request_path.py              # every protocol
    python benchmarks/request_path.py rest grpc    # TorchServe REST and TorchServe gRPC only
    python benchmarks/request_path.py -v rest      # the functions called, file by file

Protocols: ``rest`` (POST /predictions), ``v2`` (POST /v2/models/m/infer, JSON), ``grpc`` (TorchServe's Predictions),
``grpc-oip`` (ModelInfer).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

import servetune
from servetune.api.server import ApiServer
from servetune.archive import create_archive
from servetune.config.server import Address, ServerConfig
from servetune.protos import OIP, TORCHSERVE_INFERENCE, methods
from servetune.server.backend import NativeBackend

ROOT = str(Path(servetune.__file__).parent) + "/"
HANDLER = "def handle(data, context):\n    return None if data is None else [b'ok' for _ in data]\n"
PROTOCOLS = ("rest", "v2", "grpc", "grpc-oip")
VERBOSE = False  # -v: list the functions, not only the files


def start(store: Path) -> tuple[ApiServer, asyncio.AbstractEventLoop]:
    loopback = Address("http", "127.0.0.1", 0)
    config = ServerConfig(
        inference_address=loopback,
        management_address=loopback,
        metrics_address=loopback,
        model_store=store,
        load_models=("m=m.mar",),
        default_workers_per_model=1,
        disable_token_authorization=True,
        grpc_inference_port=0,
        grpc_management_port=0,
        key_file=store / "key_file.json",
    )
    server = ApiServer(config, NativeBackend(config))
    loop = asyncio.new_event_loop()
    threading.Thread(target=lambda: loop.run_until_complete(server.serve()), daemon=True).start()
    while server.readiness.starting or "grpc_inference" not in server.urls:
        time.sleep(0.05)
    return server, loop


def sender(server: ApiServer, protocol: str) -> Callable[[], None]:
    if protocol in ("rest", "v2"):
        if protocol == "rest":
            path, body, kind = "/predictions/m", b"x", "text/plain"
        else:
            tensor = {"name": "x", "shape": [1], "datatype": "BYTES", "data": ["a"]}
            path, body, kind = "/v2/models/m/infer", json.dumps({"inputs": [tensor]}).encode(), "application/json"
        url = server.urls["inference"] + path

        def post() -> None:
            request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": kind})
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()

        return post
    channel = grpc.insecure_channel(server.urls["grpc_inference"].removeprefix("grpc://"))
    if protocol == "grpc":
        method = methods(TORCHSERVE_INFERENCE)["Predictions"]
        message = method.request(model_name="m", input={"data": b"x"})
    else:
        method = methods(OIP)["ModelInfer"]
        message = method.request(model_name="m")
        message.inputs.add(name="x", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"a")
    stub = channel.unary_unary(method.path, request_serializer=method.request.SerializeToString)
    return lambda: stub(message, timeout=30)


def traced(loop: asyncio.AbstractEventLoop, send: Callable[[], None]) -> dict[str, int]:
    """The servetune files (relative to the package) whose code ran while ``send`` was answered, with call counts."""
    seen: dict[str, int] = {}

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(ROOT):
            name = frame.f_code.co_filename[len(ROOT) :]
            if VERBOSE:
                name += ":" + frame.f_code.co_qualname
            seen[name] = seen.get(name, 0) + 1

    for _ in range(3):  # warm: connections, first-call imports
        send()
    loop.call_soon_threadsafe(sys.setprofile, hook)
    threading.setprofile(hook)  # the loop's threads (a large body's decoding)
    time.sleep(0.2)
    send()
    time.sleep(0.2)
    threading.setprofile(None)  # type: ignore[arg-type]
    loop.call_soon_threadsafe(sys.setprofile, None)
    time.sleep(0.1)
    return seen


def main(argv: list[str]) -> int:
    global VERBOSE
    VERBOSE = "-v" in argv
    argv = [a for a in argv if a != "-v"]
    chosen = argv or list(PROTOCOLS)
    unknown = [p for p in chosen if p not in PROTOCOLS]
    if unknown:
        print(f"unknown protocols {unknown}: expected some of {', '.join(PROTOCOLS)}", file=sys.stderr)
        return 2
    store = Path(tempfile.mkdtemp(prefix="request-path-"))
    (store / "handler.py").write_text(HANDLER)
    create_archive(model_name="m", version="1.0", handler=str(store / "handler.py"), export_path=str(store))
    server, loop = start(store)
    try:
        for protocol in chosen:
            seen = traced(loop, sender(server, protocol))
            files = {name.split(":")[0] for name in seen}
            print(f"\n{protocol}: {len(files)} files")
            for name, calls in sorted(seen.items()):
                print(f"  {calls:4d}  {name}")
    finally:
        loop.call_soon_threadsafe(server.request_stop)
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
