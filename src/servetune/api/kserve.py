"""KServe's v1 protocol (TensorFlow Serving's REST form) on the inference port, for every backend.

``GET /`` (``{"status": "alive"}``: KServe's liveness route, which its SDK's v1 ``is_server_live`` calls),
``GET /v1/models`` (``{"models": [names]}``), ``GET /v1/models/{name}`` (``{"name", "ready"}``; 503 when not
ready), ``POST /v1/models/{name}:predict`` (``{"instances": [...]}`` or ``{"inputs": [...]}`` -> ``{"predictions":
[...]}``) and ``:explain`` (the handler's explanations; 501 from a handler that has none). v1 has no versions: the
default version answers. A request for a model that is not ready is refused at once with 503, as KServe's model
server refuses it. Errors: ``{"error": message}`` (``servetune.api.oip``).

The body goes to the worker as it came (inflated from gzip/deflate): the worker's ``kserve`` envelope is the one
place that reads it (strict JSON, an ``instances`` or ``inputs`` list: 400 otherwise) and hands the handler its
instances (``servetune.handlers.envelopes``).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Scope

from servetune.api import rest
from servetune.api.gateway import INFERENCE, PROBE, Call, Caller, Gateway
from servetune.api.oip_rest import kserve_answer, kserve_route
from servetune.api.rest import json_response, read_body
from servetune.api.types import Input
from servetune.handlers.control import KSERVE_V1, Control

_DROPPED_HEADERS = ("content-type", "content-length", "content-encoding")
# a request's control, built once per kind: [explain] -> predict (False) or explain (True)
_CONTROLS = (Control(KSERVE_V1), Control(KSERVE_V1, explain=True))


def kserve_routes(gateway: Gateway) -> list[BaseRoute]:
    async def alive(request: Request, who: Caller) -> Response:
        return json_response({"status": "alive"})

    async def models(request: Request, who: Caller) -> Response:
        return json_response({"models": gateway.model_names()})

    async def model_ready(request: Request, who: Caller) -> Response:
        name = request.path_params["model"]
        ready = await gateway.model_ready(name, None)
        return json_response({"name": name, "ready": ready}, 200 if ready else 503)

    async def run(request: Request, who: Caller, explain: bool) -> Response:
        body = await read_body(request, gateway.config.max_request_size, encoded=True)
        call = Call(
            request.path_params["model"],
            None,
            [Input("body", "application/json", body)],
            _CONTROLS[explain],  # :predict and :explain never share a handler call
            rest.request_headers(request, _DROPPED_HEADERS),
            refuse_not_ready=True,
        )
        return kserve_answer(await rest.infer(gateway, request, who, call))

    async def predict(request: Request, who: Caller) -> Response:
        return await run(request, who, False)

    def prepared(scope: Scope, body: bytes, params: dict[str, Any]) -> Call:
        """``run``'s Call without a coroutine (servetune's protocol, below ASGI)."""
        raw = scope["headers"]
        body = rest.decompress(body, rest.header_value(raw, b"content-encoding"), gateway.config.max_request_size)
        headers = rest.headers_dict(raw, _DROPPED_HEADERS)
        inputs = [Input("body", "application/json", body)]
        return Call(params["model"], None, inputs, _CONTROLS[False], headers, refuse_not_ready=True)

    async def explain(request: Request, who: Caller) -> Response:
        return await run(request, who, True)

    return [
        kserve_route(gateway, "/", alive, "GET", PROBE),
        kserve_route(gateway, "/v1/models", models, "GET", PROBE),
        kserve_route(gateway, "/v1/models/{model}:predict", predict, "POST", INFERENCE, direct=True, prepare=prepared),
        kserve_route(gateway, "/v1/models/{model}:explain", explain, "POST", INFERENCE),
        kserve_route(gateway, "/v1/models/{model}", model_ready, "GET", PROBE),
    ]


__all__ = ["kserve_routes"]
