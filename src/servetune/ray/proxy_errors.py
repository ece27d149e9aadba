"""Ray Serve's proxy answers some failures itself, in plain text: a replica that died mid-request (500, or no answer
at all), a full queue (503), a request timeout (408), a path while no application is deployed yet (404). TorchServe
clients expect JSON ``{"code", "type", "message"}``: this ASGI middleware, installed in Ray's proxy through Ray's hook
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=servetune.ray.proxy_errors:middlewares``, rewrites them as the native
server answers the same failures (503 + ``Retry-After`` for a dead worker or a full queue, 504 for a timeout).
Answers that are JSON already (every answer of servetune's own replicas) pass untouched.
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servetune._exceptions import ApiError

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK_PATH = "servetune.ray.proxy_errors:middlewares"
CLIENT_GONE = 499


def torchserve_error(status: int, text: str) -> ApiError:
    """The native server's answer to the failure Ray's proxy reported as ``status`` with ``text``."""
    detail = f" (Ray Serve: {text.strip()})" if text.strip() else ""
    if status in (408, 504):
        return ApiError.timeout(f"Request timed out{detail}")
    if status in (429, 503):
        return ApiError.unavailable(f"The model's queue is full or no replica is available; retry later{detail}")
    if status == 404:  # the frontend at "/" takes every path once it runs: nothing is deployed yet (or any more)
        return ApiError.unavailable(f"The server is starting: no application serves this path yet{detail}")
    if status >= 500:
        return ApiError.unavailable(f"Worker died while running this request{detail}")
    return ApiError(text.strip() or "Bad request", status, "BadRequestException")


def _json_response(error: ApiError) -> list[Message]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(error.body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    return [
        {"type": "http.response.start", "status": error.status, "headers": headers},
        {"type": "http.response.body", "body": error.body, "more_body": False},
    ]


class TorchServeErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        held: Message | None = None  # a plain-text error's start, held until its body is known
        text: list[bytes] = []

        async def rewrite(message: Message) -> None:
            nonlocal started, held
            if message["type"] == "http.response.start":
                started = True
                headers = dict(message.get("headers") or [])
                json = headers.get(b"content-type", b"").startswith(b"application/json")
                if message["status"] >= 400 and message["status"] != CLIENT_GONE and not json:
                    held = message
                    return
            elif message["type"] == "http.response.body" and held is not None:
                text.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                for out in _json_response(
                    torchserve_error(int(held["status"]), b"".join(text).decode(errors="replace"))
                ):
                    await send(out)
                return
            await send(message)

        try:
            await self.app(scope, receive, rewrite)
        except Exception as exc:
            if started:
                raise
            for out in _json_response(torchserve_error(500, repr(exc))):
                await send(out)
            return
        if not started:  # the proxy gave up without an answer (a replica died mid-request)
            for out in _json_response(torchserve_error(500, "")):
                await send(out)


def middlewares() -> list[Middleware]:
    """Ray's proxy callback: the middlewares to wrap its HTTP app with."""
    return [Middleware(TorchServeErrors)]


__all__ = ["PROXY_CALLBACK_ENV", "PROXY_CALLBACK_PATH", "TorchServeErrors", "middlewares", "torchserve_error"]
