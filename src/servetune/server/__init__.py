"""The model server: frontend (three HTTP APIs, registry, batchers, worker pool) and worker processes."""

from __future__ import annotations

from servetune.server.app import Server, serve

__all__ = ["Server", "serve"]
