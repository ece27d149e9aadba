"""Run one of servetune's API apps inside a Ray Serve deployment: Ray hands ``__call__`` a Starlette request; the
app answers through ASGI; this turns what it sent into the Response Ray sends back. One code path for the API on
both backends, at the cost of buffering the answer (servetune's answers are never streamed)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message


async def call_app(app: ASGIApp, request: Request) -> Response:
    scope = dict(request.scope)
    # Ray routes by the application's route prefix and may hand it over as root_path; the API apps route full paths.
    path, root = str(scope.get("path", "")), str(scope.get("root_path", ""))
    if root and not path.startswith(root):
        path = root + path
    scope.update(path=path, raw_path=path.encode(), root_path="")
    status, headers, body = 500, [], []

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = int(message["status"]), list(message.get("headers") or [])
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    await app(scope, request.receive, send)
    response = Response(b"".join(body), status)
    response.raw_headers = [(k, v) for k, v in headers if k.lower() != b"x-request-id"]  # Ray's proxy adds its own
    return response


__all__ = ["call_app"]
