"""HTTP pieces every TorchServe-style API shares: JSON bodies and headers as TorchServe sends them, and errors."""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from servetune._exceptions import ApiError

NO_CACHE_HEADERS = {
    "Pragma": "no-cache",
    "Cache-Control": "no-cache; no-store, must-revalidate, private",
    "Expires": "Thu, 01 Jan 1970 00:00:00 UTC",
}


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Pretty-printed JSON (TorchServe's Gson output) with TorchServe's no-cache headers."""
    body = json.dumps(payload, indent=2)
    return Response(body + "\n", status, {**NO_CACHE_HEADERS, **(headers or {})}, media_type="application/json")


def error_response(error: ApiError) -> Response:
    return Response(error.body, error.status, {**NO_CACHE_HEADERS, **error.headers}, media_type="application/json")


def kserve_error_response(error: ApiError) -> Response:
    """KServe's (and the Open Inference Protocol's) error answer: ``{"error": message}`` with the error's status."""
    body = json.dumps({"error": error.message}).encode()
    return Response(body, error.status, {**NO_CACHE_HEADERS, **error.headers}, media_type="application/json")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_exception(request: Request, exc: Exception) -> Response:
    status = int(getattr(exc, "status_code", 500))
    if status == 404:
        return error_response(ApiError.not_found())
    if status == 405:
        return error_response(ApiError.method_not_allowed())
    return error_response(ApiError(str(getattr(exc, "detail", exc)), status, "BadRequestException"))


def exception_handlers() -> dict[Any, Any]:
    """Starlette's exception handlers: ApiError and Starlette's own 404/405 answered as TorchServe answers them."""
    return {HTTPException: _http_exception, ApiError: _api_error}


def without_trailing_slash(app: ASGIApp) -> ASGIApp:
    """TorchServe routes ``/models/x/`` as ``/models/x``; Starlette would redirect it (307), which a DELETE or PUT
    client does not follow. Strip one trailing slash before routing."""

    async def strip(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
        await app(scope, receive, send)

    return strip


__all__ = [
    "NO_CACHE_HEADERS",
    "error_response",
    "exception_handlers",
    "json_response",
    "kserve_error_response",
    "without_trailing_slash",
]
