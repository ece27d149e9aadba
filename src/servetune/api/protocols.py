"""The inference port's protocols beyond TorchServe's own REST API: each one a module of ``servetune.api`` written
against the same :class:`~servetune.api.types.InferenceBackend`, so that it works on every backend (the native
server, and on Ray through the replicas and the frontend application). ``create_inference_app`` mounts the routes
listed here after TorchServe's: KServe v1 (``servetune.api.kserve``) and the Open Inference Protocol v2 REST
(``servetune.api.oip_rest``)."""

from __future__ import annotations

from starlette.routing import BaseRoute

from servetune.api.kserve import kserve_routes
from servetune.api.oip_rest import RestServed, oip_routes


def http_routes(served: RestServed) -> list[BaseRoute]:
    """Routes of the other HTTP protocols."""
    return [*kserve_routes(served), *oip_routes(served)]


__all__ = ["RestServed", "http_routes"]
