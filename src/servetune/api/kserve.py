"""KServe's v1 protocol (TensorFlow Serving's REST form) on the inference port, for every backend.

``GET /`` (``{"status": "alive"}``: KServe's liveness route, which its SDK's v1 ``is_server_live`` calls),
``GET /v1/models`` (``{"models": [names]}``), ``GET /v1/models/{name}`` (``{"name", "ready"}``; 503 when not
ready), ``POST /v1/models/{name}:predict`` (``{"instances": [...]}`` or ``{"inputs": [...]}`` -> ``{"predictions":
[...]}``) and ``:explain`` (the handler's explanations; 501 from a handler that has none). v1 has no versions: the
default version answers. The worker's ``kserve`` envelope hands the handler the instances
(``servetune.handlers.envelopes``). A request for a model that is not ready is refused at once with 503, as
KServe's model server refuses it. Errors: ``{"error": message}`` (``servetune.api.oip``).
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from servetune._exceptions import ApiError
from servetune.api.http import json_response
from servetune.api.offload import off_loop
from servetune.api.oip_rest import RestServed, failure_answer, inference_runner, read_inference_request
from servetune.api.types import InferRequest, Input
from servetune.handlers.control import KSERVE_V1, Control
from servetune.tensors import strict_json

_DROPPED_HEADERS = ("content-type", "content-length", "content-encoding")


def check_v1_body(body: bytes) -> None:
    """A v1 request is a JSON object with an ``instances`` or ``inputs`` list (ApiError 400 otherwise); strict JSON
    (``NaN`` and ``Infinity`` are not JSON)."""
    try:
        payload = strict_json(body)
    except (ValueError, RecursionError) as exc:
        raise ApiError.bad_request(f"the body is not valid JSON ({exc})") from None
    rows = payload.get("instances", payload.get("inputs")) if isinstance(payload, dict) else None
    if not isinstance(rows, list):
        raise ApiError.bad_request('expected a JSON object {"instances": [...]} or {"inputs": [...]}')


def kserve_routes(served: RestServed) -> list[BaseRoute]:
    backend, config, metrics, readiness, authorize = served.parts()
    failed = failure_answer(readiness, metrics)

    async def alive(request: Request) -> Response:
        authorize(request, True)
        return json_response({"status": "alive"})

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

    async def v1_job(request: Request, request_id: str, explain: bool) -> InferRequest:
        body, _ = await read_inference_request(request, config.max_request_size)
        await off_loop(len(body), check_v1_body, body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED_HEADERS}
        inputs = [Input("body", "application/json", body)]
        control = Control(KSERVE_V1, explain=explain)  # :predict and :explain never share a handler call
        return InferRequest(request_id, headers, inputs, time.monotonic(), control=control)

    run = inference_runner(served, failed, v1_job)

    async def predict(request: Request) -> Response:
        return await run(request, request.path_params["model"], None, False)

    async def explain(request: Request) -> Response:
        return await run(request, request.path_params["model"], None, True)

    return [
        Route("/", alive, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model}:predict", predict, methods=["POST"]),
        Route("/v1/models/{model}:explain", explain, methods=["POST"]),
        Route("/v1/models/{model}", model_ready, methods=["GET"]),
    ]


__all__ = ["check_v1_body", "kserve_routes"]
