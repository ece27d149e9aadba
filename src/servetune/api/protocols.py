"""The inference port's protocols beyond TorchServe's own REST API: each one a module of ``servetune.api`` written
against the same :class:`~servetune.api.types.InferenceBackend`, so that it works on every backend (the native
server, and on Ray through the replicas and the frontend application). ``create_inference_app`` mounts the routes
listed here after TorchServe's."""

from __future__ import annotations

from starlette.routing import BaseRoute

from servetune.api.metrics import ApiMetrics
from servetune.api.types import InferenceBackend, Readiness
from servetune.config.server import ServerConfig


def http_routes(
    backend: InferenceBackend, config: ServerConfig, metrics: ApiMetrics | None, readiness: Readiness
) -> list[BaseRoute]:
    """Routes of the other HTTP protocols (none yet: KServe v1 and the Open Inference Protocol v2 come here)."""
    return []


__all__ = ["http_routes"]
