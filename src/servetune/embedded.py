"""Start a ``servetune serve`` subprocess on free loopback ports and drive it (the tuner's, benchmarks' and tests'
server), on either backend.

    with EmbeddedServer(model_store, models={"m": "m.mar"}, properties={...}) as server:
        server.inference_url, server.management_url, server.metrics_url, server.auth_headers()
        server.grpc_inference_target, server.grpc_management_target   # "127.0.0.1:PORT", for grpc.insecure_channel

It learns where the server listens from the server's ready file (``servetune.ready``), not from its printed lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from servetune._exceptions import ServetuneError
from servetune.ready import ReadyInfo

# CPUs a private local Ray instance (``ray_address="local"``) advertises; default: this machine's
RAY_NUM_CPUS_ENV = "SERVETUNE_RAY_NUM_CPUS"
_POLL_S = 0.05


class EmbeddedServer:
    """A real server process. Token auth stays on (the key file lives in a private temp dir) unless disabled.

    ``backend="ray"``: ``servetune serve --backend ray``. ``ray_address``: ``local`` starts a private Ray instance
    inside the server process (stopped with it; ``ray_num_cpus`` sets the CPUs it advertises, default this
    machine's), None follows Ray's own rule. The Ray backend has no metrics API of its own unless it serves one.
    """

    def __init__(
        self,
        model_store: Path | None = None,
        models: Mapping[str, str] | None = None,
        properties: Mapping[str, str] | None = None,
        *,
        workdir: Path | None = None,
        startup_timeout: float = 300.0,
        echo: bool = False,
        fail_on_model_error: bool = True,
        backend: str = "native",
        ray_address: str | None = None,
        ray_num_cpus: int | None = None,
    ) -> None:
        if backend not in ("native", "ray"):
            raise ValueError(f"backend must be 'native' or 'ray', got {backend!r}")
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="servetune-embedded-")
        self.workdir = workdir or Path(self._tmp.name if self._tmp else ".")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.model_store = model_store
        self.models = dict(models or {})
        self.properties = {
            "inference_address": "http://127.0.0.1:0",
            "management_address": "http://127.0.0.1:0",
            "metrics_address": "http://127.0.0.1:0",
            "grpc_inference_port": "0",
            "grpc_management_port": "0",
            "key_file": str(self.workdir / "key_file.json"),
            **(properties or {}),
        }
        self.startup_timeout = startup_timeout
        self.echo = echo
        self.fail_on_model_error = fail_on_model_error
        self.backend = backend
        # The server's environment: this process's, with these set (None: removed). The backend is named outright,
        # so that a SERVETUNE_BACKEND exported in the caller's shell cannot change it.
        self.env: dict[str, str | None] = {"PYTHONUNBUFFERED": "1", "SERVETUNE_BACKEND": backend}
        if backend == "ray":
            self.env["RAY_ADDRESS"] = ray_address
            self.env[RAY_NUM_CPUS_ENV] = None if ray_num_cpus is None else str(ray_num_cpus)
        self.ready_file = self.workdir / "ready.json"
        self.ready: ReadyInfo | None = None
        self.output: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._pump: threading.Thread | None = None

    @property
    def urls(self) -> dict[str, str]:
        return dict(self.ready.urls) if self.ready is not None else {}

    @property
    def inference_url(self) -> str:
        return self.urls["inference"]

    @property
    def management_url(self) -> str:
        return self.urls["management"]

    @property
    def metrics_url(self) -> str:
        return self.urls["metrics"]

    @property
    def grpc_inference_target(self) -> str:
        """``host:port`` of the gRPC inference port (TorchServe's inference service, OIP, health)."""
        return self.urls["grpc_inference"].removeprefix("grpc://")

    @property
    def grpc_management_target(self) -> str:
        return self.urls["grpc_management"].removeprefix("grpc://")

    @property
    def failed_models(self) -> dict[str, str]:
        """Start-up models that did not load, and why."""
        return dict(self.ready.failed) if self.ready is not None else {}

    def auth_headers(self, kind: str = "management") -> dict[str, str]:
        key_file = Path(self.properties["key_file"])
        if not key_file.exists():
            return {}
        return {"Authorization": f"Bearer {json.loads(key_file.read_text())[kind]['key']}"}

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for key, value in self.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def start(self) -> EmbeddedServer:
        config = self.workdir / "config.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties.items()))
        self.ready_file.unlink(missing_ok=True)
        args = [sys.executable, "-m", "servetune", "serve", "--ts-config", str(config)]
        args += ["--ready-file", str(self.ready_file)]
        if self.model_store is not None:
            args += ["--model-store", str(self.model_store)]
        if self.models:
            args += ["--models", " ".join(f"{k}={v}" for k, v in self.models.items())]
        self.proc = subprocess.Popen(
            args,
            cwd=self.workdir,
            env=self.environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        proc = self.proc

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                self.output.append(line)
                if self.echo:
                    print(f"[server] {line}", file=sys.stderr, flush=True)

        self._pump = threading.Thread(target=pump, name="embedded-server-output", daemon=True)
        self._pump.start()
        deadline = time.monotonic() + self.startup_timeout
        try:
            while not self.ready_file.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(_POLL_S)
        except BaseException:  # interrupted while it starts (Ctrl-C, a tuner's SIGTERM): leave nothing running
            self.stop()
            raise
        if not self.ready_file.exists() or proc.poll() is not None:
            self.stop()
            tail = "\n".join(self.output[-30:])
            raise ServetuneError(f"the embedded server did not start:\n{tail}")
        self.ready = ReadyInfo.read(self.ready_file)
        if self.ready.failed and self.fail_on_model_error:
            self.stop()
            raise ServetuneError(
                "; ".join(f"failed to load model {name}: {why}" for name, why in sorted(self.ready.failed.items()))
            )
        return self

    def stop(self, timeout: float = 60.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._pump is not None:
            self._pump.join(10)
        if proc.stdout is not None:
            proc.stdout.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return proc.returncode

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


__all__ = ["RAY_NUM_CPUS_ENV", "EmbeddedServer"]
