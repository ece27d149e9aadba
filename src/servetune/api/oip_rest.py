"""The Open Inference Protocol v2 over REST, on the inference port (KServe's ``/v2`` API), for every backend.

``GET /v2/health/live``, ``/v2/health/ready`` (the server's readiness, as ``/ping``: 503 while not ready), ``/v2``
(server metadata), ``/v2/models`` (KServe's list), ``/v2/models/{name}[/versions/{version}]`` (model metadata),
``.../ready`` (503 when not ready), ``POST .../infer`` (and ``.../explain``, as TorchServe routes it; both 503 at
once for a model that is not ready, as KServe answers). Inference bodies are JSON or the binary tensor data extension
(``Inference-Header-Content-Length``); gzip/deflate request bodies are accepted. Errors: ``{"error": message}``
(``servetune.api.oip``). The gateway (``servetune.api.gateway``) decides the rest.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Scope

from servetune import __version__
from servetune._exceptions import ApiError
from servetune.api import rest
from servetune.api.gateway import INFERENCE, PROBE, Access, Answer, Call, Caller, Gateway
from servetune.api.offload import OFF_LOOP_BYTES, off_loop
from servetune.api.oip import answer_error, oip_call, tensor_error
from servetune.api.rest import (
    Endpoint,
    Prepare,
    answer_response,
    json_response,
    kserve_error_response,
    read_body,
    route,
)
from servetune.tensors import HEADER_LENGTH, InferenceRequest, TensorError, parse_header_length, parse_request

SERVER_NAME = "servetune"
_HEADER_LENGTH = HEADER_LENGTH.lower().encode("latin-1")
EXTENSIONS = ("binary_tensor_data",)


def kserve_answer(answer: Answer) -> Response:
    """A worker's answer as KServe v1 / OIP v2 REST send it: an error answer as ``{"error": ...}``."""
    if answer.result.status != 200:
        return kserve_error_response(answer_error(answer.result))
    return answer_response(answer)


def kserve_route(
    gateway: Gateway,
    path: str,
    endpoint: Endpoint,
    method: str,
    access: Access,
    *,
    direct: bool = False,
    prepare: Prepare | None = None,
) -> BaseRoute:
    """A route of KServe's protocols: its errors as ``{"error": message}``; ``direct``: a hot route, ``prepare``: its
    parser below ASGI, the answer rendered by :func:`kserve_answer` (``rest.route``)."""
    errors, render = kserve_error_response, kserve_answer
    return route(gateway, path, endpoint, [method], access, errors, direct=direct, prepare=prepare, render=render)


def oip_routes(gateway: Gateway) -> list[BaseRoute]:
    config = gateway.config

    async def live(request: Request, who: Caller) -> Response:
        return json_response({"live": True})

    async def server_ready(request: Request, who: Caller) -> Response:
        ready = await gateway.server_ready()
        return json_response({"ready": ready}, 200 if ready else 503)

    async def server_metadata(request: Request, who: Caller) -> Response:
        return json_response({"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)})

    async def models(request: Request, who: Caller) -> Response:
        return json_response({"models": gateway.model_names()})

    def target(request: Request) -> tuple[str, str | None]:
        return request.path_params["model"], request.path_params.get("version")

    async def model_metadata(request: Request, who: Caller) -> Response:
        return json_response((await gateway.metadata(*target(request))).to_json())

    async def model_ready(request: Request, who: Caller) -> Response:
        name, version = target(request)
        ready = await gateway.model_ready(name, version)
        return json_response({"name": name, "ready": ready}, 200 if ready else 503)

    def parsed(body: bytes, header_length: int | None, name: str, version: str | None, headers: dict[str, str],
               explain: bool) -> Call:  # fmt: skip
        """Parse (within the tensor limits) and re-encode for the worker: on a thread for a large body."""
        try:
            request: InferenceRequest = parse_request(body, header_length, config.tensor_limits)
        except TensorError as exc:
            hint = "" if header_length is not None else f" (binary data needs the {HEADER_LENGTH} header)"
            raise tensor_error(exc, hint if "JSON" in str(exc) else "") from None
        return oip_call(request, name, version, headers, explain=explain)

    async def run(request: Request, who: Caller, explain: bool) -> Response:
        body = await read_body(request, config.max_request_size, encoded=True)
        try:
            header_length = parse_header_length(request.headers.get(HEADER_LENGTH))
        except TensorError as exc:
            raise ApiError.bad_request(str(exc)) from None
        name, version = target(request)
        headers = rest.request_headers(request)
        call = await off_loop(len(body), parsed, body, header_length, name, version, headers, explain)
        return kserve_answer(await rest.infer(gateway, request, who, call))

    async def infer(request: Request, who: Caller) -> Response:
        return await run(request, who, False)

    def prepared(scope: Scope, body: bytes, params: dict[str, Any]) -> Call | None:
        """``run``'s Call without a coroutine (servetune's protocol, below ASGI); None for a body that is parsed on
        a thread (over ``OFF_LOOP_BYTES`` once inflated): the ASGI way parses it."""
        raw = scope["headers"]
        body = rest.decompress(body, rest.header_value(raw, b"content-encoding"), config.max_request_size)
        if len(body) > OFF_LOOP_BYTES:
            return None
        try:
            header_length = parse_header_length(rest.header_value(raw, _HEADER_LENGTH))
        except TensorError as exc:
            raise ApiError.bad_request(str(exc)) from None
        return parsed(body, header_length, params["model"], params.get("version"), rest.headers_dict(raw), False)

    async def explain(request: Request, who: Caller) -> Response:
        return await run(request, who, True)

    routes = [
        kserve_route(gateway, "/v2/health/live", live, "GET", PROBE),
        kserve_route(gateway, "/v2/health/ready", server_ready, "GET", PROBE),
        kserve_route(gateway, "/v2", server_metadata, "GET", PROBE),
        kserve_route(gateway, "/v2/models", models, "GET", PROBE),
    ]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            kserve_route(gateway, prefix, model_metadata, "GET", PROBE),
            kserve_route(gateway, f"{prefix}/ready", model_ready, "GET", PROBE),
            kserve_route(gateway, f"{prefix}/infer", infer, "POST", INFERENCE, direct=True, prepare=prepared),
            kserve_route(gateway, f"{prefix}/explain", explain, "POST", INFERENCE),
        ]
    return routes


__all__ = ["EXTENSIONS", "SERVER_NAME", "kserve_answer", "kserve_route", "oip_routes"]
