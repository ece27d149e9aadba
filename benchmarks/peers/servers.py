"""Each server of benchmarks/vs_peers.py: how it is launched, what a request to it looks like, which processes are its.

Every server runs as a process tree of its own (a new session), from a fresh temp folder, with the model and its
settings in its environment (see apps/common.py): ``workers`` workers of 1 torch thread each (OMP_NUM_THREADS and
MKL_NUM_THREADS = 1 as well), its own dynamic batching at ``batch`` and ``delay_ms`` (none at batch 1), keep-alive
on. It is ready when a real prediction answers 200; ``ready_s`` is the time from the launch to that answer.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
APPS = HERE / "apps"
ROOT = HERE.parents[1]

PEERS = ("torchserve", "triton", "litserve", "bentoml", "mlserver", "ray")
SERVERS = ("servetune", *PEERS)
ANSWERING_GRACE_S = 120.0  # a server that answers HTTP but no prediction with 200 for this long has failed


@dataclass(frozen=True)
class Deployment:
    model: str  # noop | resnet18
    workers: int
    batch: int
    delay_ms: int


@dataclass(frozen=True)
class Assets:
    """What every server serves: the archives (servetune, TorchServe), the model file, weights, labels, the input."""

    store: Path  # noop.mar, resnet18.mar (servetune's built-in image_classifier), ts-resnet18.mar (TorchServe's)
    model_dir: Path  # model.py, resnet18.pt, index_to_name.json (the peers' apps load these)
    image: Path
    text: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports (Triton takes its HTTP port + 1 and + 2)."""
    for _ in range(100):
        first = free_port()
        try:
            socks = []
            for port in range(first, first + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no run of free ports")


class Server:
    """A server under test; subclasses say how to launch it and what a request is."""

    name = ""

    def __init__(self, deployment: Deployment, assets: Assets, python: Path | None) -> None:
        self.deployment = deployment
        self.assets = assets
        self.python = python  # the peer's venv Python (None: servetune's own)
        self._tmp = tempfile.TemporaryDirectory(prefix=f"vs-peers-{self.name}-")
        self.dir = Path(self._tmp.name)
        self.port = free_ports(3)
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen: dict[int, psutil.Process] = {}
        self.ready_s = float("nan")
        self.body_file = self.dir / "body"

    # ---- what subclasses say ---------------------------------------------------------------------------------

    def command(self) -> list[str]:
        raise NotImplementedError

    def url(self) -> str:
        raise NotImplementedError

    def body(self, payload: bytes) -> tuple[bytes, str]:
        """(request body, content type) carrying ``payload`` (a PNG, or b"hello")."""
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        d = self.deployment
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            {
                "PEER_MODEL": d.model,
                "PEER_PORT": str(self.port),
                "PEER_WORKERS": str(d.workers),
                "PEER_BATCH": str(d.batch),
                "PEER_DELAY_MS": str(d.delay_ms),
                "PEER_ASSETS": str(self.assets.model_dir),
                "PYTHONPATH": str(APPS),
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "TMPDIR": str(self.dir),
                "HOME": os.environ.get("HOME", str(self.dir)),
            }
        )
        if self.python is not None:
            env["PATH"] = f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}"
            env["VIRTUAL_ENV"] = str(self.python.parents[1])
        return env

    # ---- life ------------------------------------------------------------------------------------------------

    def start(self, timeout: float = 600.0) -> None:
        payload = self.assets.image.read_bytes() if self.deployment.model == "resnet18" else b"hello"
        body, self.content_type = self.body(payload)
        self.body_file.write_bytes(body)
        launched = time.monotonic()
        with open(self.dir / "output.log", "wb") as out:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=self.dir,
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            deadline = launched + timeout
            last, answering = "", None  # when it first answered HTTP at all
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                self._remember()
                status, last = self._try_predict()
                if status == 200:
                    self.ready_s = time.monotonic() - launched
                    return
                if status and answering is None:
                    answering = time.monotonic()
                if answering is not None and time.monotonic() - answering > ANSWERING_GRACE_S:
                    break  # up, but failing every prediction: a broken setup, not a slow start
                time.sleep(0.05)
        except BaseException:  # interrupted while waiting (SIGTERM, Ctrl-C): leave nothing running
            self.stop()
            raise
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(
            f"{self.name} did not answer a prediction with 200 (last: {last[:300]}); its log ends:\n{tail}"
        )

    def _try_predict(self) -> tuple[int, str]:
        request = urllib.request.Request(
            self.url(), data=self.body_file.read_bytes(), headers={"Content-Type": self.content_type}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read(300).decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(300).decode(errors="replace")
        except (OSError, ValueError) as exc:
            return 0, repr(exc)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return (self.dir / "output.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _remember(self) -> None:
        """Note every process of the tree, so that none can outlive stop()."""
        if self.proc is None:
            return
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass

    def processes(self) -> list[psutil.Process]:
        self._remember()
        alive = []
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                continue
        return alive

    def stop(self) -> None:
        if self.proc is not None:
            self._remember()
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            deadline = time.monotonic() + 10
            for p in self.seen.values():  # a daemon that left the session (Ray's) still goes
                try:
                    if p.is_running():
                        p.kill()
                        p.wait(max(0.1, deadline - time.monotonic()))
                except (psutil.NoSuchProcess, psutil.TimeoutExpired):
                    pass
            self.proc = None
        self._tmp.cleanup()


def _json(value: object) -> tuple[bytes, str]:
    return json.dumps(value).encode(), "application/json"


def _text(payload: bytes) -> str:
    """A payload as the JSON peers carry it: text as is, an image in base64."""
    return payload.decode() if payload == b"hello" else base64.b64encode(payload).decode()


# ---- servetune and TorchServe: the same .mar files, TorchServe's APIs -------------------------------------------


def _models_json(d: Deployment, mar: str) -> str:
    entry = {
        "defaultVersion": True,
        "marName": mar,
        "minWorkers": d.workers,
        "maxWorkers": d.workers,
        "batchSize": d.batch,
        "maxBatchDelay": d.delay_ms,
        "responseTimeout": 120,
    }
    return json.dumps({d.model: {"1.0": entry}})


class Servetune(Server):
    """``servetune serve`` as docs/server.md recommends: threads_per_worker, its batching, keep-alive (default)."""

    name = "servetune"

    def command(self) -> list[str]:
        d, port = self.deployment, self.port
        properties = {
            "inference_address": f"http://127.0.0.1:{port}",
            "management_address": f"http://127.0.0.1:{port + 1}",
            "metrics_address": f"http://127.0.0.1:{port + 2}",
            "grpc_inference_port": str(free_port()),
            "grpc_management_port": str(free_port()),
            "disable_token_authorization": "true",
            "default_workers_per_model": str(d.workers),
            "threads_per_worker": "1",
            "job_queue_size": "1000",
            "models": _models_json(d, f"{d.model}.mar"),
        }
        config = self.dir / "config.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        return [sys.executable, "-m", "servetune", "serve", "--model-store", str(self.assets.store)] + [
            "--ts-config",
            str(config),
            "--models",
            f"{d.model}={d.model}.mar",
        ]

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # servetune as this harness imports it
        return env

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/predictions/{self.deployment.model}"

    def body(self, payload: bytes) -> tuple[bytes, str]:
        return payload, "image/png" if payload != b"hello" else "application/octet-stream"


class TorchServe(Server):
    """TorchServe 0.12 as benchmarks/vs_torchserve.py runs it (quiet log4j2, Prometheus metrics in memory, no
    system metrics, Netty's default threads), from its own venv, Java 17 from Debian."""

    name = "torchserve"

    def command(self) -> list[str]:
        from vs_torchserve import QUIET_LOG4J2

        d, port = self.deployment, self.port
        mar = "ts-resnet18.mar" if d.model == "resnet18" else "noop.mar"
        properties = {
            "inference_address": f"http://127.0.0.1:{port}",
            "management_address": f"http://127.0.0.1:{port + 1}",
            "metrics_address": f"http://127.0.0.1:{port + 2}",
            "grpc_inference_port": str(free_port()),
            "grpc_management_port": str(free_port()),
            "disable_token_authorization": "true",
            "default_workers_per_model": str(d.workers),
            "netty_client_threads": "0",
            "job_queue_size": "1000",
            "metrics_mode": "prometheus",
            "disable_system_metrics": "true",
            "async_logging": "true",
            "models": _models_json(d, mar),
        }
        config = self.dir / "config.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        (self.dir / "log4j2.xml").write_text(QUIET_LOG4J2)
        assert self.python is not None
        return [str(self.python.parent / "torchserve"), "--start", "--foreground", "--ncs", "--disable-token-auth"] + [
            "--model-store",
            str(self.assets.store),
            "--ts-config",
            str(config),
            "--log-config",
            str(self.dir / "log4j2.xml"),
            "--models",
            f"{d.model}={mar}",
        ]

    def env(self) -> dict[str, str]:
        env = super().env()
        env["TEMP"] = str(self.dir)
        return env

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/predictions/{self.deployment.model}"

    def body(self, payload: bytes) -> tuple[bytes, str]:
        return payload, "image/png" if payload != b"hello" else "application/octet-stream"


# ---- the Python peers: each one's app in apps/ -------------------------------------------------------------------


class LitServe(Server):
    name = "litserve"

    def command(self) -> list[str]:
        return [str(self.python), str(APPS / "litserve_app.py")]

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/predict"

    def body(self, payload: bytes) -> tuple[bytes, str]:
        return _json({"data": _text(payload)})


class BentoML(Server):
    name = "bentoml"

    def command(self) -> list[str]:
        assert self.python is not None
        return [str(self.python.parent / "bentoml"), "serve", "bentoml_app:Peer"] + [
            "--working-dir",
            str(APPS),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]

    def env(self) -> dict[str, str]:
        env = super().env()
        env["BENTOML_HOME"] = str(self.dir / "bentoml")
        env["BENTOML_DO_NOT_TRACK"] = "True"
        return env

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/predict"

    def body(self, payload: bytes) -> tuple[bytes, str]:
        text = _text(payload)
        return _json({"data": [text] if self.deployment.batch > 1 else text})


class MLServer(Server):
    name = "mlserver"

    def command(self) -> list[str]:
        d, port = self.deployment, self.port
        settings = {
            "http_port": port,
            "grpc_port": port + 1,
            "metrics_port": port + 2,
            "host": "127.0.0.1",
            "parallel_workers": d.workers,
            "debug": False,
        }
        (self.dir / "settings.json").write_text(json.dumps(settings))
        model = {
            "name": d.model,
            "implementation": "mlserver_model.PeerModel",
            "max_batch_size": d.batch,
            "max_batch_time": d.delay_ms / 1000.0 if d.batch > 1 else 0,
        }
        (self.dir / "model-settings.json").write_text(json.dumps(model))
        assert self.python is not None
        return [str(self.python.parent / "mlserver"), "start", str(self.dir)]

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v2/models/{self.deployment.model}/infer"

    def body(self, payload: bytes) -> tuple[bytes, str]:
        return _json({"inputs": [{"name": "data", "shape": [1], "datatype": "BYTES", "data": [_text(payload)]}]})


class Triton(Server):
    name = "triton"

    def command(self) -> list[str]:
        return [str(self.python), str(APPS / "triton_app.py")]

    def env(self) -> dict[str, str]:
        env = super().env()
        # Triton's Python stub loads the libpython of the interpreter it runs under; without this every model fails
        # with "'_thread.RLock' object has no attribute '_recursion_count'"
        libdir = str(sysconfig.get_config_var("LIBDIR") or "")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
        return env

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v2/models/{self.deployment.model}/infer"

    def body(self, payload: bytes) -> tuple[bytes, str]:
        return _json({"inputs": [{"name": "data", "shape": [1, 1], "datatype": "BYTES", "data": [_text(payload)]}]})


class Ray(Server):
    name = "ray"

    def command(self) -> list[str]:
        return [str(self.python), str(APPS / "ray_app.py")]

    def env(self) -> dict[str, str]:
        env = super().env()
        env["RAY_TMPDIR"] = str(self.dir)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        return env

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.deployment.model}"

    def body(self, payload: bytes) -> tuple[bytes, str]:
        return payload, "image/png" if payload != b"hello" else "application/octet-stream"


LAUNCHERS: dict[str, type[Server]] = {
    "servetune": Servetune,
    "torchserve": TorchServe,
    "triton": Triton,
    "litserve": LitServe,
    "bentoml": BentoML,
    "mlserver": MLServer,
    "ray": Ray,
}


def needs(name: str) -> str | None:
    """What a server needs from this machine that is missing, or None."""
    if name == "torchserve" and shutil.which("java") is None:
        return "java not found (Debian: apt-get install openjdk-17-jre-headless)"
    return None
