"""Start a ``servetune serve`` subprocess on free loopback ports and drive it (the tuner's and benchmarks' server).

with EmbeddedServer(model_store, models={"m": "m.mar"}, properties={...}) as server:
    server.inference_url, server.management_url, server.metrics_url, server.auth_headers()
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from servetune._exceptions import ServetuneError

_BOUND = re.compile(r"^(Inference|Management|Metrics) API bound to (\S+)")
STARTED = "Model server started."


class EmbeddedServer:
    """A real server process. Token auth stays on (the key file lives in a private temp dir) unless disabled."""

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
    ) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="servetune-embedded-")
        self.workdir = workdir or Path(self._tmp.name if self._tmp else ".")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.model_store = model_store
        self.models = dict(models or {})
        self.properties = {
            "inference_address": "http://127.0.0.1:0",
            "management_address": "http://127.0.0.1:0",
            "metrics_address": "http://127.0.0.1:0",
            "key_file": str(self.workdir / "key_file.json"),
            **(properties or {}),
        }
        self.startup_timeout = startup_timeout
        self.echo = echo
        self.fail_on_model_error = fail_on_model_error
        # The server's environment: this process's, with these set (None: removed). The backend is named outright,
        # so that a SERVETUNE_BACKEND exported in the caller's shell cannot turn this into a Ray server.
        self.env: dict[str, str | None] = {"PYTHONUNBUFFERED": "1", "SERVETUNE_BACKEND": "native"}
        self.output: list[str] = []
        self.urls: dict[str, str] = {}
        self.proc: subprocess.Popen[str] | None = None
        self._pump: threading.Thread | None = None

    @property
    def inference_url(self) -> str:
        return self.urls["inference"]

    @property
    def management_url(self) -> str:
        return self.urls["management"]

    @property
    def metrics_url(self) -> str:
        return self.urls["metrics"]

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
        args = [sys.executable, "-m", "servetune", "serve", "--ts-config", str(config)]
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
        started = threading.Event()
        proc = self.proc

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                self.output.append(line)
                if self.echo:
                    print(f"[server] {line}", file=sys.stderr, flush=True)
                match = _BOUND.match(line)
                if match:
                    self.urls[match.group(1).lower()] = match.group(2)
                if line.startswith(STARTED):
                    started.set()
            started.set()

        self._pump = threading.Thread(target=pump, name="embedded-server-output", daemon=True)
        self._pump.start()
        if not started.wait(self.startup_timeout) or proc.poll() is not None:
            self.stop()
            tail = "\n".join(self.output[-30:])
            raise ServetuneError(f"the embedded server did not start:\n{tail}")
        failed = [line for line in self.output if line.startswith("ERROR: failed to load model")]
        if failed and self.fail_on_model_error:
            self.stop()
            raise ServetuneError("; ".join(failed))
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
