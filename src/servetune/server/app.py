"""``servetune serve`` on the native backend: the API layer's server over :class:`NativeBackend`."""

from __future__ import annotations

from pathlib import Path

from servetune.api.server import ApiServer
from servetune.config.server import ServerConfig
from servetune.server import early
from servetune.server.backend import NativeBackend


class _Backend(NativeBackend):
    async def started(self, failed: dict[str, str]) -> None:
        await super().started(failed)
        early.release()  # the start-up models have loaded: a parent started early for one that took none goes


def serve(config: ServerConfig, models: tuple[str, ...] = (), ready_file: Path | None = None) -> int:
    """Run a server in the foreground until SIGTERM/SIGINT. Start-up models' parents start before anything else is
    imported (``servetune.server.early``; the CLI calls ``early.start`` before it imports this module)."""
    try:
        return ApiServer(config, _Backend(config), models, ready_file).run()
    finally:
        early.release()


__all__ = ["serve"]
