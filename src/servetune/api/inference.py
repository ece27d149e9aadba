"""The inference port's app: every HTTP protocol over one gateway (``servetune.api.gateway``), whatever the backend
(the native server, a Ray model replica and the Ray frontend each serve this app over their own).

The protocols, each a module that parses its wire format into the gateway's ``Call`` and renders its ``Answer``, in
the order their routes are tried: TorchServe's own (``torchserve_rest``), KServe v1 (``kserve``), the Open Inference
Protocol v2 over REST (``oip_rest``). Adding an HTTP protocol: its module, and its line in :data:`PROTOCOLS`.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from servetune.api.auth import TokenStore
from servetune.api.gateway import Gateway
from servetune.api.kserve import kserve_routes
from servetune.api.metrics import ApiMetrics
from servetune.api.oip_rest import oip_routes
from servetune.api.rest import exception_handlers, with_direct_routes
from servetune.api.torchserve_rest import torchserve_routes
from servetune.api.types import InferenceBackend, Readiness
from servetune.config.server import ServerConfig

PROTOCOLS: tuple[Callable[[Gateway], list[BaseRoute]], ...] = (torchserve_routes, kserve_routes, oip_routes)


def inference_app(gateway: Gateway) -> ASGIApp:
    """Every protocol of :data:`PROTOCOLS` through ``gateway``; the predictions' routes answered ahead of the router
    (``rest.with_direct_routes``)."""
    routes = [r for protocol in PROTOCOLS for r in protocol(gateway)]
    return with_direct_routes(Starlette(routes=routes, exception_handlers=exception_handlers()), routes)


def create_inference_app(
    backend: InferenceBackend,
    config: ServerConfig,
    *,
    tokens: TokenStore | None = None,
    metrics: ApiMetrics | None = None,
    readiness: Readiness | None = None,
) -> ASGIApp:
    """The inference app over ``backend``, with a gateway of its own (a Ray replica's or frontend's)."""
    return inference_app(Gateway(backend, config, tokens=tokens, readiness=readiness, metrics=metrics))


__all__ = ["PROTOCOLS", "create_inference_app", "inference_app"]
