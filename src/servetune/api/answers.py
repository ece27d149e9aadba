"""What every inference protocol does with a request once parsed: watch the client while it waits for its batch,
run it, answer with the handler's output and where its time went, count it in the metrics."""

from __future__ import annotations

import asyncio
import os
import re
import time

from starlette.requests import Request
from starlette.responses import Response

from servetune._exceptions import ApiError
from servetune.api.http import NO_CACHE_HEADERS, error_response
from servetune.api.keepalive import CLIENT_GONE_KEY
from servetune.api.metrics import ApiMetrics
from servetune.api.types import InferenceBackend, InferRequest, InferResult, Readiness

QUEUE_HEADER = "X-Servetune-Queue-Ms"
HANDLER_HEADER = "X-Servetune-Handler-Ms"
BATCH_HEADER = "X-Servetune-Batch-Size"
CLIENT_GONE = 499  # nginx's "client closed request": nobody is left to read the answer


def client_gone(request: Request) -> tuple[asyncio.Task[None], list[bool]]:
    """Watch the connection while the request waits for its batch: a client that went away is dropped from the
    queue instead of run. Returns the watcher (cancel it when done) and a flag cell."""
    gone = [False]

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone[0] = True
                return

    return asyncio.create_task(watch()), gone


async def run_watched(
    backend: InferenceBackend, request: Request, name: str, version: str | None, job: InferRequest
) -> InferResult:
    """``backend.infer`` for a request whose body has been read, dropping it if its client goes away. servetune's
    HTTP protocol puts a flag in the scope (no task per request); under another server, a task watches ``receive``."""
    flag = request.scope.get(CLIENT_GONE_KEY)
    if flag is not None:
        job.is_disconnected = flag
        return await backend.infer(name, version, job)
    watcher, gone = client_gone(request)
    job.is_disconnected = lambda: gone[0]
    try:
        return await backend.infer(name, version, job)
    finally:
        watcher.cancel()


def while_starting(error: ApiError, name: str | None, readiness: Readiness) -> ApiError:
    """A model not found while the server still loads its start-up models is 503 (it may be one of them), not 404."""
    if error.status == 404 and readiness.starting and name is not None:
        return ApiError.unavailable(f"Model {name} is not loaded yet: the server is loading its start-up models")
    return error


def new_request_id() -> str:
    """A random id in the UUID text form (``os.urandom`` is ~7x cheaper than ``str(uuid.uuid4())``)."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def request_headers(request: Request) -> dict[str, str]:
    """The request's headers as the handler sees them (lower-case names; the last of repeated ones)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in request.scope["headers"]}


def timing_headers(result: InferResult, request_id: str) -> dict[str, str]:
    return {
        QUEUE_HEADER: f"{result.queue_ms:.3f}",
        HANDLER_HEADER: f"{result.handler_ms:.3f}",
        BATCH_HEADER: str(result.batch_size),
        "x-request-id": request_id,
    }


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's field-name
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters, CR and LF among them


def header_problem(headers: dict[str, str], content_type: str | None) -> str | None:
    """Why the handler's response headers cannot be sent (a CR/LF would split the answer), or None."""
    fields = [*headers.items(), *((("content-type", content_type),) if content_type else ())]
    for name, value in fields:
        if not _TOKEN.fullmatch(str(name)):
            return f"the handler set a response header with an invalid name {str(name)[:80]!r}"
        text = str(value)
        if _BAD_VALUE.search(text) or not text.isascii() and not _latin1(text):
            return f"the handler set response header {name!r} to an invalid value {text[:80]!r} (CR, LF or control)"
    return None


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def answer_problem(result: InferResult, max_response_size: int) -> ApiError | None:
    """Why the worker's answer cannot be sent as it is: too large (507), or headers that HTTP cannot carry (500)."""
    if len(result.body) > max_response_size:
        return ApiError.response_too_large(len(result.body), max_response_size)
    problem = header_problem(result.headers, result.content_type)
    return ApiError.internal(problem) if problem is not None else None


def result_response(result: InferResult, request_id: str, max_response_size: int) -> Response:
    problem = answer_problem(result, max_response_size)
    if problem is not None:
        return error_response(problem)
    headers = {**NO_CACHE_HEADERS, **result.headers, **timing_headers(result, request_id)}
    return Response(result.body, result.status, headers, media_type=result.content_type)


def observe(metrics: ApiMetrics | None, name: str, version: str | None, result: InferResult, received: float) -> None:
    """Count a request the backend answered (``received``: ``time.perf_counter()`` when it arrived)."""
    if metrics is not None:
        metrics.observe_request(
            name,
            result.version or version or "",
            result.status,
            time.perf_counter() - received,
            result.queue_ms / 1000.0,
            result.handler_ms / 1000.0 or None,
        )


__all__ = [
    "BATCH_HEADER",
    "CLIENT_GONE",
    "HANDLER_HEADER",
    "answer_problem",
    "header_problem",
    "QUEUE_HEADER",
    "client_gone",
    "new_request_id",
    "request_headers",
    "observe",
    "result_response",
    "run_watched",
    "while_starting",
    "timing_headers",
]
