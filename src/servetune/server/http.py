"""HTTP pieces shared by the three APIs: TorchServe's JSON bodies and headers, errors, token checks."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from servetune._exceptions import ModelError

NO_CACHE_HEADERS = {
    "Pragma": "no-cache",
    "Cache-Control": "no-cache; no-store, must-revalidate, private",
    "Expires": "Thu, 01 Jan 1970 00:00:00 UTC",
}
NOT_FOUND_MESSAGE = "Requested resource is not found, please refer to API document."
METHOD_NOT_ALLOWED_MESSAGE = "Requested method is not allowed, please refer to API document."


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(payload, indent=2)
    return Response(body + "\n", status, {**NO_CACHE_HEADERS, **(headers or {})}, media_type="application/json")


def error_response(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"code": status, "type": type_, "message": message}, status, headers)


def model_error_response(exc: ModelError) -> Response:
    return error_response(exc.status, exc.type, exc.message)


def not_found(request: Request, exc: Exception) -> Response:
    return error_response(404, "ResourceNotFoundException", NOT_FOUND_MESSAGE)


def method_not_allowed(request: Request, exc: Exception) -> Response:
    return error_response(405, "MethodNotAllowedException", METHOD_NOT_ALLOWED_MESSAGE)


async def http_exception(request: Request, exc: Exception) -> Response:
    status = int(getattr(exc, "status_code", 500))
    if status == 404:
        return not_found(request, exc)
    if status == 405:
        return method_not_allowed(request, exc)
    return error_response(status, "BadRequestException", str(getattr(exc, "detail", exc)))


def exception_handlers() -> dict[Any, Any]:
    from starlette.exceptions import HTTPException

    async def model_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ModelError)
        return model_error_response(exc)

    return {HTTPException: http_exception, ModelError: model_error}
