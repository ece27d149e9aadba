"""The metrics API (TorchServe's port 8082): ``GET /metrics`` in Prometheus text format."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from servetune.server.http import exception_handlers, json_response
from servetune.server.metrics import ServerMetrics


def create_metrics_app(metrics: ServerMetrics) -> Starlette:
    async def metrics_endpoint(request: Request) -> Response:
        names = request.query_params.getlist("name[]")
        registry = metrics.registry.restricted_registry(names) if names else metrics.registry
        return Response(generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def api_description(request: Request) -> Response:
        return json_response(
            {
                "openapi": "3.0.1",
                "info": {"title": "servetune metrics API", "version": "1"},
                "paths": {
                    "/metrics": {
                        "get": {"operationId": "metrics", "responses": {"200": {"description": "Prometheus text"}}}
                    }
                },
            }
        )

    return Starlette(
        routes=[Route("/metrics", metrics_endpoint, methods=["GET"]), Route("/", api_description, methods=["OPTIONS"])],
        exception_handlers=exception_handlers(),
    )
