"""The inference port's protocols beyond TorchServe's own REST API: each one a module of ``servetune.api`` written
against the same :class:`~servetune.api.types.InferenceBackend`, so that it works on every backend (the native
server, and on Ray through the replicas and the frontend application). ``create_inference_app`` mounts the routes
listed here after TorchServe's: KServe v1 (``servetune.api.kserve``) and the Open Inference Protocol v2 REST
(``servetune.api.oip_rest``)."""

from __future__ import annotations

from starlette.routing import BaseRoute

from servetune.api.kserve import kserve_routes
from servetune.api.metrics import ApiMetrics
from servetune.api.oip_rest import Authorize, oip_routes
from servetune.api.types import InferenceBackend, Readiness
from servetune.config.server import ServerConfig


def http_routes(
    backend: InferenceBackend,
    config: ServerConfig,
    metrics: ApiMetrics | None,
    readiness: Readiness,
    authorize: Authorize,
) -> list[BaseRoute]:
    """Routes of the other HTTP protocols; ``authorize(request, probe)`` checks the inference token (``probe``: a
    health or metadata call, open when ``open_ping`` is set)."""
    return [
        *kserve_routes(backend, config, metrics, readiness, authorize),
        *oip_routes(backend, config, metrics, readiness, authorize),
    ]


__all__ = ["http_routes"]
