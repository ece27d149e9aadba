"""``servetune serve`` on the native backend: the API layer's server over :class:`NativeBackend`."""

from __future__ import annotations

from pathlib import Path

from servetune.api.server import ApiServer
from servetune.config.server import ServerConfig
from servetune.server import early
from servetune.server.backend import NativeBackend


def serve(config: ServerConfig, models: tuple[str, ...] = (), ready_file: Path | None = None) -> int:
    """Run a server in the foreground until SIGTERM/SIGINT. Start-up models' parents start before anything else is
    imported (``servetune.server.early``; the CLI calls ``early.start`` before it imports this module)."""
    try:
        return ApiServer(config, NativeBackend(config), models, ready_file).run()
    finally:
        early.release()


__all__ = ["serve"]
