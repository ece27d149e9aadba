"""TorchServe's inference API (port 8080): ``/ping``, ``/predictions``, ``/explanations``, the API description.

Written once over an :class:`~servetune.api.types.InferenceBackend`: the native server, a Ray model replica and the
Ray frontend each serve this same app over their own backend.
"""

from __future__ import annotations

import asyncio
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from servetune._exceptions import ApiError
from servetune.api import protocols
from servetune.api.answers import (
    CLIENT_GONE,
    new_request_id,
    observe,
    request_headers,
    result_response,
    run_watched,
    while_starting,
)
from servetune.api.auth import TokenStore
from servetune.api.body import parse_inputs, read_body
from servetune.api.http import error_response, exception_handlers, json_response
from servetune.api.metrics import ApiMetrics
from servetune.api.openapi import inference_spec
from servetune.api.types import InferenceBackend, InferRequest, InferResult, Readiness
from servetune.config.server import ServerConfig
from servetune.handlers.control import TORCHSERVE, Control


async def infer_http(
    backend: InferenceBackend,
    request: Request,
    name: str,
    version: str | None,
    config: ServerConfig,
    request_id: str,
    *,
    explain: bool = False,
) -> InferResult:
    """Read, parse and run one HTTP prediction request (raises ApiError)."""
    body = await read_body(request, config.max_request_size)
    inputs = await parse_inputs(request, body)
    control = Control(TORCHSERVE, explain=explain)  # the route decides; a client's ``explain`` header does not
    job = InferRequest(request_id, request_headers(request), inputs, time.monotonic(), control=control)
    return await run_watched(backend, request, name, version, job)


def create_inference_app(
    backend: InferenceBackend,
    config: ServerConfig,
    *,
    tokens: TokenStore | None = None,
    metrics: ApiMetrics | None = None,
    readiness: Readiness | None = None,
) -> Starlette:
    require_token = tokens is not None and config.inference_token_authorization
    readiness = readiness or Readiness()

    def authorize(request: Request, probe: bool = False) -> None:
        """The inference token, when required (``probe``: a health check, open with ``open_ping``)."""
        if probe and config.open_ping:
            return
        if require_token and not (
            tokens is not None and tokens.check("inference", request.headers.get("authorization"))
        ):
            raise ApiError.invalid_key()

    async def ping(request: Request) -> Response:
        authorize(request, probe=True)
        if not readiness.starting and not readiness.failed and await backend.healthy():
            return json_response({"status": "Healthy"})
        payload: dict[str, object] = {"status": "Unhealthy"}
        if readiness.failed:
            payload["failedModels"] = dict(readiness.failed)
        return json_response(payload, 500)

    async def api_description(request: Request) -> Response:
        return json_response(inference_spec(sorted({m.name for m in backend.models()})))

    async def predict(request: Request, explain: bool) -> Response:
        authorize(request)
        received = time.perf_counter()
        name = request.path_params["model"]
        version = request.path_params.get("version")
        request_id = request.headers.get("x-request-id") or new_request_id()
        try:
            result = await infer_http(backend, request, name, version, config, request_id, explain=explain)
        except ApiError as exc:
            exc = while_starting(exc, name, readiness)
            if metrics is not None:
                metrics.observe_status(exc.status)
            return error_response(exc)
        except asyncio.CancelledError:
            return Response(b"", CLIENT_GONE)  # the client went away before its batch was sent
        observe(metrics, name, version, result, received)
        return result_response(result, request_id, config.max_response_size)

    async def predictions(request: Request) -> Response:
        return await predict(request, explain=False)

    async def explanations(request: Request) -> Response:
        return await predict(request, explain=True)

    routes = [
        Route("/", api_description, methods=["OPTIONS"]),
        Route("/api-description", api_description, methods=["GET", "OPTIONS"]),
        Route("/ping", ping, methods=["GET", "POST"]),
        Route("/predictions/{model}", predictions, methods=["POST", "PUT"]),
        Route("/predictions/{model}/{version}", predictions, methods=["POST", "PUT"]),
        Route("/explanations/{model}", explanations, methods=["POST", "PUT"]),
        Route("/explanations/{model}/{version}", explanations, methods=["POST", "PUT"]),
        *protocols.http_routes(protocols.RestServed(backend, config, metrics, readiness, authorize)),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers())


__all__ = ["create_inference_app", "infer_http", "result_response"]
