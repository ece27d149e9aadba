"""The server's life, the same on every backend: bind the APIs, load the start-up models, say it is ready, serve
until a signal, shut down.

ApiServer(config, backend).run()  ->  backend.open()  ->  bind (inference unless the backend serves it itself,
management, metrics; then the gRPC APIs, on Ray too: the driver serves them through handles)  ->  register the
start-up models (``/ping`` answers 500 meanwhile)  ->  ready file and ``Model server started.``  ->  wait for
SIGTERM/SIGINT  ->  stop accepting, finish in-flight requests within the grace period, ``backend.close()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from servetune._exceptions import ApiError, ConfigError
from servetune.api.auth import TokenStore
from servetune.api.gateway import Gateway
from servetune.api.http1 import DirectMatch
from servetune.api.http_limits import HeaderLimits, guarded_protocol
from servetune.api.inference import inference_app
from servetune.api.management import Management, create_management_app
from servetune.api.metrics import create_metrics_app
from servetune.api.plan import RegisterParams
from servetune.api.rest import DirectRoutes, without_trailing_slash
from servetune.api.types import Backend, Readiness
from servetune.config.server import Address, ServerConfig
from servetune.ready import ReadyInfo
from servetune.startup import CLOCK, freeze_heap
from servetune.startup import log as startup_log

if TYPE_CHECKING:
    from servetune.api.grpc import GrpcServers

log = logging.getLogger("servetune.server")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class EmbeddedUvicorn(uvicorn.Server):
    """A uvicorn server that leaves signals to us: several of them share one loop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_socket(address: Address) -> socket.socket:
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only when it sees the TCP protocol
    # number, and without NODELAY every keep-alive response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address.host, address.port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind {address.url()}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def startup_models(config: ServerConfig, cli_models: tuple[str, ...]) -> list[tuple[str | None, str]]:
    """``--models``/``load_models`` entries as (name or None, url); ``all`` means every archive in the store."""
    if not cli_models and config.model_snapshot:  # TorchServe restores a snapshot instead of load_models
        return [
            (name, entry["marName"]) for name, versions in config.model_snapshot.items() for entry in versions.values()
        ]
    entries = cli_models or config.load_models
    out: list[tuple[str | None, str]] = []
    for entry in entries:
        if entry in ("standalone", "none"):
            continue
        if entry == "all":
            if config.model_store is None:
                raise ConfigError("load_models=all needs a model store (--model-store)")
            for path in sorted(config.model_store.iterdir()):
                if path.name.endswith((".mar", ".tar.gz", ".tgz")) or (path / "MAR-INF").is_dir():
                    out.append((None, path.name))
            continue
        name, sep, url = entry.partition("=")
        out.append((name, url) if sep else (None, entry))
    return out


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (``uvicorn[standard]`` brings it), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def header_limits(config: ServerConfig) -> HeaderLimits:
    return HeaderLimits(
        config.max_header_line_size,
        config.max_header_size,
        config.max_header_count,
        config.header_timeout_ms / 1000.0,
        config.body_timeout_ms / 1000.0,
        config.incoming_bytes,
        config.max_request_size,
    )


def uvicorn_config(app: Any, config: ServerConfig, direct: DirectMatch | None = None) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        loop="asyncio",
        http=guarded_protocol(header_limits(config), direct),  # header limits; ab -k: HTTP/1.0 keep-alive too
        timeout_keep_alive=30,
        # uvicorn's default rewrites each request's client address and scheme from X-Forwarded-For/-Proto (from
        # 127.0.0.1): a middleware on every request for fields servetune never reads; TorchServe ignores them too.
        proxy_headers=False,
        timeout_graceful_shutdown=int(config.shutdown_grace_period) or None,
        limit_concurrency=None,
    )


class ApiServer:
    def __init__(
        self, config: ServerConfig, backend: Backend, models: tuple[str, ...] = (), ready_file: Path | None = None
    ) -> None:
        self.config = config
        self.backend = backend
        self.models = models
        self.ready_file = ready_file
        self.management = Management(backend, config)
        self.readiness = Readiness(starting=True)  # until the start-up models are loaded: /ping says Unhealthy
        self.tokens: TokenStore | None = None
        self.gateway = Gateway(backend, config, readiness=self.readiness, metrics=backend.metrics)  # tokens: bind()
        self.urls: dict[str, str] = {}
        self._servers: list[EmbeddedUvicorn] = []
        self.grpc: GrpcServers | None = None
        self._stop = asyncio.Event()

    def run(self) -> int:
        """Connect the backend on the main thread, then serve on an event loop until a signal (uvloop's, where it is
        installed: uvicorn's own ``loop`` setting does not apply to a server that brings its loop)."""
        self.backend.open()
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(self.serve())

    def request_stop(self) -> None:
        self._stop.set()

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        tasks: list[asyncio.Task[Any]] = []
        try:
            startup_log.debug("start-up: backend and API imports, config %.0f ms", CLOCK.lap_ms())
            tasks = self.bind()
            startup_log.debug("start-up: HTTP APIs bound %.0f ms", CLOCK.lap_ms())
            # the start-up models' workers start while the gRPC stack is imported and bound (on two cores, in parallel)
            if await self._unless_stopped(self.load_startup_models(alongside=self.bind_grpc())):
                startup_log.debug(
                    "start-up: gRPC bound and models loaded %.0f ms; ready %.0f ms after exec",
                    CLOCK.lap_ms(),
                    CLOCK.since_exec_ms(),
                )
                await self._stop.wait()
        finally:
            await self.shutdown(tasks)
        return 0

    async def _unless_stopped(self, work: Awaitable[None]) -> bool:
        """Run ``work`` unless a signal asks the server to stop first: a pod deleted while its models load stops
        within its grace period, not after the loads (which the shutdown then undoes). False if it was stopped."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait((task, stop), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            stop.cancel()
        if task.done():
            task.result()
            return True
        say("Model server stopping while its models load")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:  # the shutdown goes on: the backend stops what the loads started
            log.exception("start-up models failed as they were cancelled")
        return False

    def bind(self) -> list[asyncio.Task[Any]]:
        config, backend = self.config, self.backend
        if config.token_auth:
            self.tokens = TokenStore(config.key_file, config.token_expiration_min)
        # one gateway for every API and transport of this process (gRPC's too: bind_grpc)
        self.gateway = Gateway(backend, config, tokens=self.tokens, readiness=self.readiness, metrics=backend.metrics)
        apps: list[tuple[str, Address, Any]] = []
        if backend.inference_url is None:
            apps.append(("inference", config.inference_address, inference_app(self.gateway)))
        else:
            self.urls["inference"] = backend.inference_url
        apps.append(("management", config.management_address, create_management_app(self.management, self.gateway)))
        if config.enable_metrics_api and backend.metrics is not None:
            apps.append(("metrics", config.metrics_address, create_metrics_app(backend.metrics)))
        tasks = []
        for name, address, app in apps:
            sock = bind_socket(address)
            self.urls[name] = address.url(sock.getsockname()[1])
            direct = app.match if isinstance(app, DirectRoutes) else None  # predictions below ASGI (api/http1.py)
            server = EmbeddedUvicorn(uvicorn_config(without_trailing_slash(app), config, direct))
            self._servers.append(server)
            tasks.append(asyncio.create_task(server.serve(sockets=[sock]), name=f"http-{name}"))
        for name, url in self.urls.items():
            say(f"{name.capitalize()} API bound to {url}")
        if self.tokens is not None:
            say(f"Token authorization is on; keys are in {config.key_file.resolve()} (mode 0600)")
        if any(
            a.host not in LOOPBACK
            for a in (config.inference_address, config.management_address, config.metrics_address)
        ):
            say("WARNING: an API listens beyond loopback; make sure token authorization stays on")
        return tasks

    async def bind_grpc(self) -> None:
        """TorchServe's gRPC inference and management APIs and the OIP gRPC service, after the HTTP APIs. The gRPC
        stack (grpc, the compiled protos) is imported here, on a thread: the event loop meanwhile starts workers."""
        started = time.perf_counter()
        grpc_api = await asyncio.to_thread(importlib.import_module, "servetune.api.grpc")
        self.grpc = grpc_api.GrpcServers(self.gateway, self.management)
        for name, url in (await self.grpc.start()).items():
            self.urls[name] = url
            say(f"gRPC {name.removeprefix('grpc_').capitalize()} API bound to {url.removeprefix('grpc://')}")
        startup_log.debug("start-up: gRPC imported and bound %.0f ms", (time.perf_counter() - started) * 1000.0)
        hosts = (self.config.grpc_inference_address, self.config.grpc_management_address)
        if any(host not in LOOPBACK for host in hosts):
            say("WARNING: a gRPC API listens beyond loopback; make sure token authorization stays on")

    async def load_startup_models(self, alongside: Awaitable[None] | None = None) -> None:
        """Register every start-up model (concurrently) before saying the server is up; ``/ping`` says Unhealthy
        meanwhile, and stays so if one fails to load (whatever the failure: its ``failedModels`` entry says why).
        ``alongside`` runs while they load, and finishes first."""
        self.readiness.starting = True
        entries = startup_models(self.config, self.models)

        async def load(name: str | None, url: str) -> None:
            params = RegisterParams(url=url, model_name=name, loaded_at_startup=True)
            try:
                _, message = await self.management.register(params)
                say(message)
            except ApiError as exc:
                self.readiness.failed[name or url] = exc.message
                say(f"ERROR: failed to load model {name or url}: {exc.message}")
            except Exception as exc:  # never a traceback exit: the server runs, Unhealthy, naming the model
                log.exception("start-up model %s failed to load", name or url)
                self.readiness.failed[name or url] = f"{type(exc).__name__}: {exc}"
                say(f"ERROR: failed to load model {name or url}: {type(exc).__name__}: {exc}")

        loading = asyncio.gather(*(load(name, url) for name, url in entries))
        if alongside is not None:
            try:
                await alongside
            except BaseException:
                loading.cancel()
                raise
        await loading
        registered = {(m.name, m.version) for m in self.backend.models()}
        for name, versions in self.config.model_snapshot.items():  # the snapshot's default versions
            for version, entry in versions.items():
                if entry.get("defaultVersion") and (name, version) in registered:
                    await self.backend.set_default(name, version)
        await self.backend.started(dict(self.readiness.failed))
        # what start-up made (the APIs, the gRPC stack, the models' entries) is kept for good: out of the collector's
        # full passes, which otherwise stop the event loop tens of ms every minute under load
        took_ms = freeze_heap(collect=True)
        startup_log.debug("start-up: heap collected and frozen, %d objects, %.0f ms", gc.get_freeze_count(), took_ms)
        self.readiness.starting = False
        if self.ready_file is not None:
            models: dict[str, list[str]] = {}
            for ref in self.backend.models():
                models.setdefault(ref.name, []).append(ref.version)
            info = ReadyInfo(os.getpid(), self.backend.name, dict(self.urls), models, dict(self.readiness.failed))
            info.write(self.ready_file)
        say("Model server started.")

    async def shutdown(self, tasks: list[asyncio.Task[Any]]) -> None:
        say("Model server stopping: finishing in-flight requests")
        for server in self._servers:
            server.should_exit = True
        if self.grpc is not None:
            tasks.append(asyncio.create_task(self.grpc.stop(self.config.shutdown_grace_period)))
        await asyncio.gather(*tasks, return_exceptions=True)
        self.management.cancel_background()
        await self.backend.close(grace_s=0.0)
        if self.tokens is not None:
            self.tokens.remove()
        say("Model server stopped.")


def say(message: str) -> None:
    """Lines for the operator (and for TorchServe's tooling, which waits for ``Model server started.``)."""
    print(message, flush=True, file=sys.stdout)


__all__ = ["ApiServer", "EmbeddedUvicorn", "bind_socket", "say", "startup_models"]
