"""TorchServe's inference API (port 8080): ``/ping``, ``/predictions``, ``/explanations`` and the API description,
through the gateway (``servetune.api.gateway``): this module parses TorchServe's request (form fields or the body as
the inputs) and renders the handler's answer as it is.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Message, Scope

from servetune._exceptions import ApiError
from servetune.api import rest
from servetune.api.gateway import INFERENCE, OPEN, PROBE, Call, Caller, Gateway
from servetune.api.openapi import inference_spec
from servetune.api.rest import answer_response, json_response, read_body, request_headers, route
from servetune.api.types import Input
from servetune.handlers.control import TORCHSERVE, Control

# a request's control, built once per kind: [explain] -> predict (False) or explain (True)
_CONTROLS = (Control(TORCHSERVE), Control(TORCHSERVE, explain=True))

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


async def parse_inputs(request: Request, body: bytes) -> list[Input]:
    """TorchServe's rule: form fields become one input each; any other body is the input ``body``."""
    ctype = request.headers.get("content-type")
    base = (ctype or "").split(";")[0].strip().lower()
    if base not in FORM_TYPES:
        return [Input("body", ctype, body)]

    async def replay() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    form_request = Request(request.scope, replay)
    try:
        form = await form_request.form(max_files=1000, max_fields=1000)
    except Exception as exc:  # python-multipart raises several types for a malformed body
        raise ApiError.bad_request(f"Malformed {base} body: {exc}") from None
    inputs: list[Input] = []
    try:
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                inputs.append(Input(name, value.content_type, await value.read()))
            else:
                inputs.append(Input(name, "text/plain", str(value).encode()))
    finally:
        await form.close()
    if not inputs:
        raise ApiError.bad_request(f"Empty {base} body: no fields")
    return inputs


def torchserve_routes(gateway: Gateway) -> list[BaseRoute]:
    async def ping(request: Request, who: Caller) -> Response:
        if await gateway.server_ready():
            return json_response({"status": "Healthy"})
        payload: dict[str, object] = {"status": "Unhealthy"}
        if gateway.readiness.failed:
            payload["failedModels"] = dict(gateway.readiness.failed)
        return json_response(payload, 500)

    async def api_description(request: Request, who: Caller) -> Response:
        return json_response(inference_spec(gateway.model_names()))

    async def predict(request: Request, who: Caller, explain: bool) -> Response:
        body = await read_body(request, gateway.config.max_request_size)
        call = Call(
            request.path_params["model"],
            request.path_params.get("version"),
            await parse_inputs(request, body),
            _CONTROLS[explain],  # the route decides; a client's ``explain`` header does not
            request_headers(request),
        )
        return answer_response(await rest.infer(gateway, request, who, call))

    async def predictions(request: Request, who: Caller) -> Response:
        return await predict(request, who, explain=False)

    def prepared(scope: Scope, body: bytes, params: dict[str, Any]) -> Call | None:
        """``predict``'s Call without a coroutine (servetune's protocol, below ASGI); a form body: None (the
        ASGI way parses it)."""
        raw = scope["headers"]
        ctype = rest.header_value(raw, b"content-type")
        if (ctype or "").split(";")[0].strip().lower() in FORM_TYPES:
            return None
        inputs = [Input("body", ctype, body)]
        return Call(params["model"], params.get("version"), inputs, _CONTROLS[False], rest.headers_dict(raw))

    async def explanations(request: Request, who: Caller) -> Response:
        return await predict(request, who, explain=True)

    return [
        route(gateway, "/", api_description, ["OPTIONS"], OPEN),
        route(gateway, "/api-description", api_description, ["GET", "OPTIONS"], OPEN),
        route(gateway, "/ping", ping, ["GET", "POST"], PROBE),
        route(gateway, "/predictions/{model}", predictions, ["POST", "PUT"], INFERENCE, direct=True, prepare=prepared),
        route(
            gateway,
            "/predictions/{model}/{version}",
            predictions,
            ["POST", "PUT"],
            INFERENCE,
            direct=True,
            prepare=prepared,
        ),
        route(gateway, "/explanations/{model}", explanations, ["POST", "PUT"], INFERENCE),
        route(gateway, "/explanations/{model}/{version}", explanations, ["POST", "PUT"], INFERENCE),
    ]


__all__ = ["parse_inputs", "torchserve_routes"]
