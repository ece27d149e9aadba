"""The native backend: registry, per-model dynamic batcher, worker pool and placement, worker processes.

Its names load on first use: a worker process (``python -m servetune.server.worker``) imports this package
first, and must not pay for the frontend's API stack (starlette, gRPC, uvicorn, Prometheus) it never runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servetune.server.app import serve
    from servetune.server.backend import NativeBackend

__all__ = ["NativeBackend", "serve"]


def __getattr__(name: str) -> Any:
    if name == "serve":
        from servetune.server.app import serve

        return serve
    if name == "NativeBackend":
        from servetune.server.backend import NativeBackend

        return NativeBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
