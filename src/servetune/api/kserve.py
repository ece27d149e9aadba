"""KServe's v1 protocol (TensorFlow Serving's REST form) on the inference port, for every backend.

``GET /v1/models`` (``{"models": [names]}``), ``GET /v1/models/{name}`` (``{"name", "ready"}``; 503 when not
ready), ``POST /v1/models/{name}:predict`` (``{"instances": [...]}`` or ``{"inputs": [...]}`` -> ``{"predictions":
[...]}``) and ``:explain`` (the handler's explanations; 501 from a handler that has none). v1 has no versions: the
default version answers. The worker's ``kserve`` envelope hands the handler the instances
(``servetune.handlers.envelopes``). Errors: ``{"error": message}`` (``servetune.api.oip``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from servetune._exceptions import ApiError
from servetune.api.answers import CLIENT_GONE, observe, result_response, run_watched
from servetune.api.http import json_response, kserve_error_response
from servetune.api.metrics import ApiMetrics
from servetune.api.oip import answer_error
from servetune.api.oip_rest import Authorize, read_inference_request
from servetune.api.types import InferenceBackend, InferRequest, Input, Readiness
from servetune.config.server import ServerConfig
from servetune.handlers.envelopes import KSERVE_V1, PROTOCOL_HEADER

_DROPPED_HEADERS = ("content-type", "content-length", "content-encoding", PROTOCOL_HEADER)


def check_v1_body(body: bytes) -> None:
    """A v1 request is a JSON object with an ``instances`` or ``inputs`` list (ApiError 400 otherwise)."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ApiError.bad_request(f"the body is not valid JSON ({exc})") from None
    rows = payload.get("instances", payload.get("inputs")) if isinstance(payload, dict) else None
    if not isinstance(rows, list):
        raise ApiError.bad_request('expected a JSON object {"instances": [...]} or {"inputs": [...]}')


def kserve_routes(
    backend: InferenceBackend,
    config: ServerConfig,
    metrics: ApiMetrics | None,
    readiness: Readiness,
    authorize: Authorize,
) -> list[BaseRoute]:
    def failed(error: ApiError, name: str) -> Response:
        if error.status == 404 and readiness.starting:
            error = ApiError.unavailable(f"Model {name} is not loaded yet: the server is loading its start-up models")
        if metrics is not None:
            metrics.observe_status(error.status)
        return kserve_error_response(error)

    async def models(request: Request) -> Response:
        authorize(request, True)
        return json_response({"models": sorted({m.name for m in backend.models()})})

    async def model_ready(request: Request) -> Response:
        authorize(request, True)
        name = request.path_params["model"]
        try:
            ready = await backend.ready(name, None)
        except ApiError as exc:
            return failed(exc, name)
        return json_response({"name": name, "ready": ready}, 200 if ready else 503)

    async def run(request: Request, explain: bool) -> Response:
        authorize(request, False)
        received = time.perf_counter()
        name = request.path_params["model"]
        request_id = request.headers.get("x-request-id") or str(uuid.uuid4())
        try:
            body, _ = await read_inference_request(request, config.max_request_size)
            check_v1_body(body)
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED_HEADERS}
            headers.update({PROTOCOL_HEADER: KSERVE_V1, "explain": "True" if explain else "False"})
            job = InferRequest(request_id, headers, [Input("body", "application/json", body)], time.monotonic())
            result = await run_watched(backend, request, name, None, job)
        except ApiError as exc:
            return failed(exc, name)
        except asyncio.CancelledError:
            return Response(b"", CLIENT_GONE)
        observe(metrics, name, None, result, received)
        if result.status != 200:
            return kserve_error_response(answer_error(result))
        response = result_response(result, request_id, config.max_response_size)
        if response.status_code != 200:
            return kserve_error_response(ApiError(f"Response of {len(result.body)} bytes is too large", 507))
        return response

    async def predict(request: Request) -> Response:
        return await run(request, explain=False)

    async def explain(request: Request) -> Response:
        return await run(request, explain=True)

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model}:predict", predict, methods=["POST"]),
        Route("/v1/models/{model}:explain", explain, methods=["POST"]),
        Route("/v1/models/{model}", model_ready, methods=["GET"]),
    ]


__all__ = ["check_v1_body", "kserve_routes"]
