"""The frontend process: three HTTP APIs on one event loop, the model registry, lifecycle and signals.

Server(config).run()  ->  startup (bind, start APIs, load startup models)  ->  wait for a signal
                      ->  shutdown (stop accepting, finish in-flight up to the grace period, stop workers)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from servetune._exceptions import ConfigError, ModelError
from servetune.config.server import Address, ServerConfig
from servetune.ready import ReadyInfo
from servetune.server.auth import TokenStore
from servetune.server.inference import create_inference_app
from servetune.server.management import create_management_app
from servetune.server.metrics_api import create_metrics_app
from servetune.server.registry import ModelRegistry, RegisterParams

log = logging.getLogger("servetune.server")


class EmbeddedUvicorn(uvicorn.Server):
    """A uvicorn server that leaves signals to us: three of them share one loop."""

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


class Server:
    def __init__(self, config: ServerConfig, models: tuple[str, ...] = (), ready_file: Path | None = None) -> None:
        self.config = config
        self.models = models
        self.ready_file = ready_file
        self.registry = ModelRegistry(config)
        self.tokens: TokenStore | None = None
        self.urls: dict[str, str] = {}
        self._servers: list[EmbeddedUvicorn] = []
        self._stop = asyncio.Event()

    def run(self) -> int:
        return asyncio.run(self.serve())

    def request_stop(self) -> None:
        self._stop.set()

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        tasks = await self.startup()
        try:
            await self._stop.wait()
        finally:
            await self.shutdown(tasks)
        return 0

    async def startup(self) -> list[asyncio.Task[Any]]:
        config = self.config
        if config.token_auth:
            self.tokens = TokenStore(config.key_file, config.token_expiration_min)
        apps = [
            ("inference", config.inference_address, create_inference_app(self.registry, self.tokens)),
            ("management", config.management_address, create_management_app(self.registry, self.tokens)),
        ]
        if config.enable_metrics_api:
            apps.append(("metrics", config.metrics_address, create_metrics_app(self.registry.metrics)))
        tasks = []
        for name, address, app in apps:
            sock = bind_socket(address)
            self.urls[name] = address.url(sock.getsockname()[1])
            uv_config = uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="off",
                loop="asyncio",
                http="servetune.api.keepalive:KeepAliveHttpToolsProtocol",
                timeout_keep_alive=30,
                timeout_graceful_shutdown=int(config.shutdown_grace_period) or None,
                limit_concurrency=None,
            )
            server = EmbeddedUvicorn(uv_config)
            self._servers.append(server)
            tasks.append(asyncio.create_task(server.serve(sockets=[sock]), name=f"http-{name}"))
        await asyncio.sleep(0)
        for name, url in self.urls.items():
            _say(f"{name.capitalize()} API bound to {url}")
        if self.tokens is not None:
            _say(f"Token authorization is on; keys are in {config.key_file.resolve()} (mode 0600)")
        if any(
            a.host not in ("127.0.0.1", "localhost", "::1")
            for a in (config.inference_address, config.management_address, config.metrics_address)
        ):
            _say("WARNING: an API listens beyond loopback; make sure token authorization stays on")
        failed: dict[str, str] = {}
        for model_name, url in startup_models(config, self.models):
            try:
                _, message = await self.registry.register(
                    RegisterParams(url=url, model_name=model_name, loaded_at_startup=True)
                )
                _say(message)
            except ModelError as exc:
                failed[model_name or url] = exc.message
                _say(f"ERROR: failed to load model {model_name or url}: {exc.message}")
        if self.ready_file is not None:
            models = {name: sorted(versions) for name, versions in self.registry.models.items()}
            ReadyInfo(os.getpid(), "native", dict(self.urls), models, failed).write(self.ready_file)
        _say("Model server started.")
        return tasks

    async def shutdown(self, tasks: list[asyncio.Task[Any]]) -> None:
        _say("Model server stopping: finishing in-flight requests")
        for server in self._servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.registry.close(grace_s=0.0)
        if self.tokens is not None:
            self.tokens.remove()
        _say("Model server stopped.")


def _say(message: str) -> None:
    print(message, flush=True, file=sys.stdout)


def serve(config: ServerConfig, models: tuple[str, ...] = (), ready_file: Path | None = None) -> int:
    """Run a server in the foreground until SIGTERM/SIGINT."""
    return Server(config, models, ready_file).run()


__all__ = ["Server", "serve", "startup_models"]
