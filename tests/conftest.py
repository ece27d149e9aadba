"""Fixtures that start real servetune servers (subprocesses, ephemeral ports) for tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

_BOUND = re.compile(r"^(Inference|Management|Metrics) API bound to (\S+)")


@dataclass
class RunningServer:
    proc: subprocess.Popen[str]
    workdir: Path
    inference_url: str = ""
    management_url: str = ""
    metrics_url: str = ""
    output: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

    @property
    def token(self) -> str | None:
        key_file = self.workdir / "key_file.json"
        if not key_file.exists():
            return None
        import json

        return str(json.loads(key_file.read_text())["management"]["key"])

    def auth(self) -> dict[str, str]:
        token = self.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def worker_pids(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Stop the server; return its exit code. Fails the test if a worker process outlives it."""
        pids = self.worker_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        deadline = time.monotonic() + 10
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if self.pump is not None:
            self.pump.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        assert not alive, f"orphan worker processes after the server stopped: {alive}"
        return self.proc.returncode


def _launch(
    workdir: Path,
    model_store: Path | None,
    models: dict[str, Path] | list[str] | None,
    properties: dict[str, str] | None,
    extra_args: list[str],
    timeout: float,
) -> RunningServer:
    props = {
        "inference_address": "http://127.0.0.1:0",
        "management_address": "http://127.0.0.1:0",
        "metrics_address": "http://127.0.0.1:0",
        "default_workers_per_model": "1",
        **(properties or {}),
    }
    config = workdir / "config.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    args = [sys.executable, "-m", "servetune", "serve", "--ts-config", str(config)]
    if model_store is not None:
        args += ["--model-store", str(model_store)]
    if models:
        entries = [f"{k}={v}" for k, v in models.items()] if isinstance(models, dict) else list(models)
        args += ["--models", " ".join(entries)]
    args += extra_args
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(args, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = RunningServer(proc, workdir)
    started = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            server.output.append(line.rstrip("\n"))
            match = _BOUND.match(line)
            if match:
                setattr(server, f"{match.group(1).lower()}_url", match.group(2))
            if line.startswith("Model server started."):
                started.set()
        started.set()

    server.pump = threading.Thread(target=pump, daemon=True)
    server.pump.start()
    if not started.wait(timeout) or proc.poll() is not None:
        proc.kill()
        proc.wait()
        server.pump.join(10)
        assert proc.stdout is not None
        proc.stdout.close()
        raise RuntimeError("server did not start:\n" + "\n".join(server.output[-40:]))
    return server


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    """Start ``servetune serve`` on ephemeral ports: ``start_server(model_store=..., models={...}, properties={...})``.

    Token authorization is off unless ``properties`` turns it on (``disable_token_authorization=false``).
    Every server started is stopped at the end, and leaves no worker process behind.
    """
    servers: list[RunningServer] = []

    def start(
        model_store: Path | None = None,
        models: dict[str, Path] | list[str] | None = None,
        properties: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
        timeout: float = 120.0,
    ) -> RunningServer:
        props = {"disable_token_authorization": "true", **(properties or {})}
        workdir = tmp_path / f"server{len(servers)}"
        workdir.mkdir()
        server = _launch(workdir, model_store, models, props, extra_args or [], timeout)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
