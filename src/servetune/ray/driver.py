"""``servetune serve --backend ray``: deploy the start-up models on a Ray cluster and serve the management API.

RayServer(config, models, address).run()  ->  connect, deploy, wait for the replicas  ->  print the same lines as
the native server (``Inference API bound to ...``, ``Model server started.``)  ->  wait for a signal  ->  delete
the Serve applications and leave the cluster (a local cluster started here stops with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path

import uvicorn

from servetune._exceptions import ConfigError, ModelError
from servetune.config.server import ServerConfig
from servetune.ray.controller import RayBackend
from servetune.ray.management import create_management_app
from servetune.ray.plan import ModelPlan, plan_models
from servetune.ray.serve_config import write_serve_config
from servetune.ready import ReadyInfo
from servetune.server.app import EmbeddedUvicorn, bind_socket
from servetune.server.auth import TokenStore

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def free_port(host: str) -> int:
    """A port that is free now on ``host`` (Ray's proxy needs a number; 0 in the config means "any")."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def proxy_location_for(host: str) -> str:
    """One proxy on the head node for a loopback address (nodes of one machine would share the port); else one per
    node, so that a load balancer can spread over them."""
    return "HeadOnly" if host in LOOPBACK else "EveryNode"


def check_config(config: ServerConfig) -> None:
    if config.inference_token_authorization and config.token_auth:
        raise ConfigError(
            "inference_token_authorization=true: the Ray backend's inference API has no token check "
            "(Ray's proxy serves it); keep it private or put an authenticating proxy in front"
        )
    if config.inference_address.scheme != "http":
        raise ConfigError(f"inference_address={config.inference_address.url()}: the Ray backend serves plain http")


class RayServer:
    def __init__(
        self,
        config: ServerConfig,
        models: tuple[str, ...] = (),
        address: str | None = None,
        ready_file: Path | None = None,
    ) -> None:
        check_config(config)
        self.ready_file = ready_file
        self.failed: dict[str, str] = {}
        self.config = config
        self.models = models
        self.address = address
        self.backend: RayBackend | None = None
        self.tokens: TokenStore | None = None
        self._stop = asyncio.Event()

    def run(self) -> int:
        """Plan and connect first, on the main thread (Ray installs its signal handlers there; ours replace them)."""
        plans = self.plan()
        address = self.config.inference_address
        port = address.port or free_port(address.host)
        self.backend = RayBackend(
            plans, host=address.host, port=port, proxy_location=proxy_location_for(address.host), address=self.address
        )
        try:
            self.backend.connect()
            return asyncio.run(self.serve(self.backend, plans, address.url(port)))
        finally:
            self.backend.shutdown()
            _say("Model server stopped.")

    def request_stop(self) -> None:
        self._stop.set()

    def plan(self) -> list[ModelPlan]:
        """The start-up models; one that cannot be read is reported as the native server does, and skipped."""

        def report(model: str, exc: ModelError | ConfigError) -> None:
            self.failed[model] = str(exc)
            _say(f"ERROR: failed to load model {model}: {exc}")

        return plan_models(self.config, self.models, on_error=report)

    async def serve(self, backend: RayBackend, plans: list[ModelPlan], inference_url: str) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        http: EmbeddedUvicorn | None = None
        task: asyncio.Task[None] | None = None
        try:
            await asyncio.to_thread(backend.deploy)
            urls = {"inference": inference_url}
            _say(f"Inference API bound to {inference_url}")
            if self.config.token_auth:
                self.tokens = TokenStore(self.config.key_file, self.config.token_expiration_min)
            sock = bind_socket(self.config.management_address)
            urls["management"] = self.config.management_address.url(sock.getsockname()[1])
            _say(f"Management API bound to {urls['management']}")
            uv_config = uvicorn.Config(
                create_management_app(backend, self.config, self.tokens),
                log_level="warning",
                access_log=False,
                lifespan="off",
                loop="asyncio",
                http="servetune.api.keepalive:KeepAliveH11Protocol",
            )
            http = EmbeddedUvicorn(uv_config)
            task = asyncio.create_task(http.serve(sockets=[sock]), name="http-management")
            timeout = float(self.config.default_startup_timeout) + 60.0
            outcome = await asyncio.to_thread(backend.wait_deployed, timeout)
            for plan in plans:
                failure = outcome.get(plan.name)
                for version, vplan in sorted(plan.versions.items()):
                    if failure is None:
                        workers = vplan.min_workers
                        _say(f'Model "{plan.name}" Version: {version} registered with {workers} initial workers')
                    else:
                        self.failed[plan.name] = failure
                        _say(f"ERROR: failed to load model {plan.name}: {failure}")
            if self.ready_file is not None:
                models = {p.name: sorted(p.versions) for p in plans if p.name not in self.failed}
                ReadyInfo(os.getpid(), "ray", urls, models, dict(self.failed)).write(self.ready_file)
            _say("Model server started.")
            await self._stop.wait()
        finally:
            _say("Model server stopping: deleting the Ray Serve applications")
            if http is not None and task is not None:
                http.should_exit = True
                await asyncio.gather(task, return_exceptions=True)
            if self.tokens is not None:
                self.tokens.remove()
        return 0


def _say(message: str) -> None:
    print(message, flush=True, file=sys.stdout)


def serve_on_ray(
    config: ServerConfig, models: tuple[str, ...] = (), address: str | None = None, ready_file: Path | None = None
) -> int:
    """Serve the start-up models on Ray until SIGTERM/SIGINT; returns the exit code."""
    return RayServer(config, models, address, ready_file).run()


def export_serve_config(config: ServerConfig, models: tuple[str, ...], path: Path) -> Path:
    """Write the Ray Serve config (``serve deploy`` / KubeRay ``serveConfigV2``) for the start-up models."""
    check_config(config)
    address = config.inference_address
    plans = plan_models(config, models)
    backend = RayBackend(plans, host=address.host, port=address.port, proxy_location=proxy_location_for(address.host))
    return write_serve_config(path, backend.config())


__all__ = ["RayServer", "export_serve_config", "free_port", "serve_on_ray"]
