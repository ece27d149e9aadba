"""The native backend: registry, per-model dynamic batcher, worker pool and placement, worker processes."""

from __future__ import annotations

from servetune.server.app import serve
from servetune.server.backend import NativeBackend

__all__ = ["NativeBackend", "serve"]
