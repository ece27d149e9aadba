"""servetune's API server in the test process, over the fake backend (tests/fake_backend.py): the real HTTP and gRPC
stacks (uvicorn with servetune's HTTP protocol, grpc.aio), the real gateway, management and protocol modules, on
ephemeral loopback ports, on an event loop of its own thread. It starts in a fraction of a second (no subprocess, no
worker process) and has the attributes of :class:`~servetune.embedded.EmbeddedServer` that the suites use, so a
protocol suite runs against it unchanged.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from fake_backend import FakeBackend
from servetune.api.server import ApiServer
from servetune.config.server import ServerConfig

START_TIMEOUT_S = 60.0


class InProcessServer:
    """``with InProcessServer(store, {"m": "m.mar"}, {...}, workdir=...) as server: server.inference_url ...``"""

    backend = "fake"

    def __init__(
        self,
        model_store: Path | None,
        models: Mapping[str, str] | None,
        properties: Mapping[str, str] | None,
        *,
        workdir: Path,
    ) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.properties = {
            "inference_address": "http://127.0.0.1:0",
            "management_address": "http://127.0.0.1:0",
            "metrics_address": "http://127.0.0.1:0",
            "grpc_inference_port": "0",
            "grpc_management_port": "0",
            "key_file": str(workdir / "key_file.json"),
            "default_workers_per_model": "1",
            "shutdown_grace_period": "0",
            **(properties or {}),
        }
        if model_store is not None:
            self.properties["model_store"] = str(model_store)
        self.config = ServerConfig.from_properties(self.properties)
        models = dict(models or {})
        self.fake = FakeBackend(self.config)
        self.server = ApiServer(self.config, self.fake, tuple(f"{name}={url}" for name, url in models.items()))
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> InProcessServer:
        def run() -> None:
            try:
                self._loop.run_until_complete(self.server.serve())
            except BaseException as exc:  # noqa: BLE001 - reported by start()
                self._error = exc

        self._thread = threading.Thread(target=run, name="servetune-in-process", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.server.readiness.starting or "grpc_management" not in self.server.urls:
            if self._error is not None or not self._thread.is_alive():
                raise RuntimeError(f"the in-process server stopped while starting: {self._error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the in-process server did not start within {START_TIMEOUT_S} s")
            time.sleep(0.01)
        if self.server.readiness.failed:
            raise RuntimeError(f"start-up models failed: {self.server.readiness.failed}")
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._loop.call_soon_threadsafe(self.server.request_stop)
        self._thread.join(30)
        self._thread = None
        if not self._loop.is_closed():
            self._loop.close()

    def __enter__(self) -> InProcessServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- what the suites read, as EmbeddedServer has it ----------------------------------------------------------

    @property
    def urls(self) -> dict[str, str]:
        return dict(self.server.urls)

    @property
    def inference_url(self) -> str:
        return self.server.urls["inference"]

    @property
    def management_url(self) -> str:
        return self.server.urls["management"]

    @property
    def metrics_url(self) -> str:
        return self.server.urls["metrics"]

    @property
    def grpc_inference_target(self) -> str:
        return self.server.urls["grpc_inference"].removeprefix("grpc://")

    @property
    def grpc_management_target(self) -> str:
        return self.server.urls["grpc_management"].removeprefix("grpc://")

    def auth_headers(self, kind: str = "management") -> dict[str, str]:
        tokens = self.server.tokens
        return {} if tokens is None else {"Authorization": f"Bearer {tokens.keys[kind].value}"}
