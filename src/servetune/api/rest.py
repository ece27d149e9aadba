"""The HTTP side of the gateway (``servetune.api.gateway``): how an HTTP request reaches it and how its answer goes
back, for every HTTP API (TorchServe's inference routes, KServe v1, OIP v2 REST, the management API).

- :func:`route`: a route with its :data:`~servetune.api.gateway.Access` and its protocol's error shape. The token is
  checked first; every error is answered in the shape (TorchServe's ``{"code", "type", "message"}``, or KServe's
  ``{"error": message}``); the status sent is counted by the gateway; a prediction whose client went away before
  its batch was sent is answered 499 (nobody reads it).
- :func:`caller`: the ``Authorization`` and ``x-request-id`` headers and the connection's disconnect flag (servetune's
  HTTP protocol puts it in the scope: ``api/http1.py``; under another server, as Ray's proxy, :func:`infer`
  watches the connection with a task).
- :func:`read_body`: the body within ``max_request_size`` where it arrives (413 as soon as it passes), inflated from
  gzip or deflate for KServe's protocols.
- :func:`answer_response`: the handler's body and headers (an answer whose headers HTTP cannot carry is a 500: a CR
  or LF would split the response), TorchServe's no-cache headers, the timing headers and ``x-request-id``.
- :class:`DirectRoutes`: the hot routes (a protocol's predictions: ``route(..., direct=True)``) answered without
  Starlette's router and middleware: the same ``guarded`` function runs, so every rule above holds; what is skipped
  is matching ~30 routes in turn and three layers of ASGI wrappers per request (~10% of a no-op prediction's CPU).
- :class:`DirectCall`: a direct route with a ``prepare`` (its parser without a coroutine) also runs below ASGI on
  servetune's own HTTP protocol (``api/http1.py``): started once a small framed body is in, submitted to the gateway
  at once, its answer rendered and written from the future's callback; the same rules, no task per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Any, cast

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from servetune._exceptions import ApiError
from servetune.api.gateway import Access, Answer, Call, Caller, Gateway
from servetune.api.http1 import CLIENT_GONE_KEY, REGULAR_APP, WRITE_WHOLE_KEY, OneWriteCycle
from servetune.api.types import InferRequest, InferResult
from servetune.timing import BATCH_SIZE, HANDLER_MS, QUEUE_MS, TIMEOUT_MS

log = logging.getLogger("servetune.api")
NO_CACHE_HEADERS = {
    "Pragma": "no-cache",
    "Cache-Control": "no-cache; no-store, must-revalidate, private",
    "Expires": "Thu, 01 Jan 1970 00:00:00 UTC",
}
CLIENT_GONE = 499  # nginx's "client closed request": nobody is left to read the answer
_QUEUE_MS, _HANDLER_MS, _BATCH_SIZE = (name.encode("latin-1") for name in (QUEUE_MS, HANDLER_MS, BATCH_SIZE))
_TIMEOUT_MS = TIMEOUT_MS.lower().encode("latin-1")

Endpoint = Callable[[Request, Caller], Awaitable[Response]]
ErrorShape = Callable[[ApiError], Response]


# ---- answers -----------------------------------------------------------------------------------------------------


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Pretty-printed JSON (TorchServe's Gson output) with TorchServe's no-cache headers."""
    body = json.dumps(payload, indent=2)
    return Response(body + "\n", status, {**NO_CACHE_HEADERS, **(headers or {})}, media_type="application/json")


def error_response(error: ApiError) -> Response:
    """An error as TorchServe answers it: ``{"code", "type", "message"}``."""
    return Response(error.body, error.status, {**NO_CACHE_HEADERS, **error.headers}, media_type="application/json")


def kserve_error_response(error: ApiError) -> Response:
    """An error as KServe's protocols (v1, OIP v2) answer it: ``{"error": message}`` with the error's status."""
    body = json.dumps({"error": error.message}).encode()
    return Response(body, error.status, {**NO_CACHE_HEADERS, **error.headers}, media_type="application/json")


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


class WholeResponse(Response):
    """A prediction's answer: Starlette's Response, its raw headers made at once (``fields``: lower-case, checked,
    without ``content-length``), and written in one go with its body by servetune's HTTP protocol
    (``http1.WRITE_WHOLE_KEY``); under another server (Ray's proxy) sent as ASGI messages like any response."""

    body: bytes  # always whole bytes here (Starlette's Response allows a memoryview)

    def __init__(self, body: bytes, status: int, fields: list[tuple[bytes, bytes]]) -> None:
        self.status_code = status
        self.background = None
        self.body = body
        self.fields = fields

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:  # type: ignore[override]
        return [*self.fields, (b"content-length", b"%d" % len(self.body))]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        whole = scope.get(WRITE_WHOLE_KEY)
        if whole is None:
            await super().__call__(scope, receive, send)
        else:
            await whole(self.status_code, self.fields, self.body)


_NO_CACHE_FIELDS = tuple((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in NO_CACHE_HEADERS.items())
# headers a handler may set that frame the answer (or end the connection): its answer then takes Starlette's way
_FRAMING = frozenset(("content-length", "content-type", "connection", "transfer-encoding"))


def answer_response(answer: Answer) -> Response:
    """The handler's answer as HTTP: its body and headers, the no-cache headers, the timing headers and the request
    id; ApiError 500 when a header the handler set cannot be sent, 400 for a client's ``x-request-id`` that
    cannot be sent back."""
    result, request_id = answer.result, answer.request_id
    handler_headers, content_type, status = result.headers, result.content_type, result.status
    problem = header_problem(handler_headers, content_type) if handler_headers or content_type else None
    if problem is not None:
        raise ApiError.internal(problem)
    if _BAD_VALUE.search(request_id):
        raise ApiError.bad_request(f"x-request-id {request_id[:80]!r} has a control character (CR, LF or other)")
    if status < 200 or status in (204, 304) or any(name.lower() in _FRAMING for name in handler_headers):
        headers = {**NO_CACHE_HEADERS, **handler_headers, **dict(answer.timing()), "x-request-id": request_id}
        return Response(result.body, status, headers, media_type=content_type)
    if handler_headers:
        merged = {**NO_CACHE_HEADERS, **handler_headers}
        fields = [(name.lower().encode("latin-1"), str(value).encode("latin-1")) for name, value in merged.items()]
    else:
        fields = list(_NO_CACHE_FIELDS)
    fields += (
        (_QUEUE_MS, b"%.3f" % result.queue_ms),
        (_HANDLER_MS, b"%.3f" % result.handler_ms),
        (_BATCH_SIZE, b"%d" % result.batch_size),
        (b"x-request-id", request_id.encode("latin-1")),
    )
    if content_type is not None:
        if content_type.startswith("text/") and "charset=" not in content_type.lower():
            content_type += "; charset=utf-8"  # as Starlette's Response adds it
        fields.append((b"content-type", content_type.encode("latin-1")))
    return WholeResponse(result.body, status, fields)


# ---- requests ----------------------------------------------------------------------------------------------------


def caller(request: Request, received: float) -> Caller:
    """What the request's head says of its caller; its deadline from ``x-servetune-timeout-ms`` (HTTP has none of its
    own). ApiError 400 for a timeout that is not a positive number."""
    scope = request.scope
    return caller_of(scope["headers"], received, scope.get(CLIENT_GONE_KEY))  # type: ignore[arg-type]


def caller_of(raw: Iterable[tuple[bytes, bytes]], received: float, gone: Callable[[], bool] | None) -> Caller:
    """:func:`caller` from the head's (lower-case name, value) pairs; of a repeated header, the first."""
    authorization = request_id = timeout = None
    for name, value in raw:
        if name == b"authorization":
            if authorization is None:
                authorization = value.decode("latin-1")
        elif name == b"x-request-id":
            if request_id is None:
                request_id = value.decode("latin-1")
        elif name == _TIMEOUT_MS and timeout is None:
            timeout = value.decode("latin-1")
    deadline = None if timeout is None else time.monotonic() + timeout_ms(timeout) / 1000.0
    return Caller(received, authorization, request_id, gone, deadline)


def timeout_ms(value: str) -> float:
    """A client's ``x-servetune-timeout-ms``: milliseconds, > 0; ApiError 400 otherwise."""
    try:
        ms = float(value)
    except ValueError:
        ms = math.nan
    if not 0 < ms <= 1e9:
        raise ApiError.bad_request(f"{TIMEOUT_MS} must be a number of milliseconds > 0, got {value[:24]!r}")
    return ms


def request_headers(request: Request, dropped: Sequence[str] = ()) -> dict[str, str]:
    """The request's headers as a handler sees them (lower-case names, the last of repeated ones), less ``dropped``
    (lower-case names)."""
    return headers_dict(request.scope["headers"], dropped)


def headers_dict(raw: Sequence[tuple[bytes, bytes]], dropped: Sequence[str] = ()) -> dict[str, str]:
    """:func:`request_headers` from the head's (lower-case name, value) pairs."""
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw}
    for name in dropped:
        headers.pop(name, None)
    return headers


def header_value(raw: Sequence[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of header ``name`` (lower-case) among the head's pairs, as Starlette's ``headers.get``."""
    for key, value in raw:
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(request: Request, limit: int, *, encoded: bool = False) -> bytes:
    """The whole body; ApiError 413 as soon as it (or its declared length) passes ``limit``. ``encoded``: a gzip or
    deflate ``Content-Encoding`` is inflated (within ``limit`` too; 415 for another coding): KServe's protocols."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError.too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError.too_large(limit)
        chunks.append(chunk)
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return decompress(body, request.headers.get("content-encoding"), limit) if encoded else body


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """A gzip or deflate request body (tritonclient's ``request_compression_algorithm``), within ``limit``."""
    encoding = (encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ApiError(f"Content-Encoding {encoding!r} is not supported (gzip, deflate)", 415, "BadRequestException")
    inflater = zlib.decompressobj(zlib.MAX_WBITS | (16 if encoding == "gzip" else 0))
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ApiError.bad_request(f"the {encoding} body cannot be decompressed ({exc})") from None
    if len(out) > limit:
        raise ApiError.too_large(limit)
    return out


async def infer(gateway: Gateway, request: Request, who: Caller, call: Call) -> Answer:
    """``gateway.infer`` for a request whose body has been read, dropping it from the queue if its client goes away.
    servetune's HTTP protocol gives the caller a disconnect flag (no task per request); under another server, a task
    watches ``receive``."""
    if who.is_disconnected is not None:
        return await gateway.infer(call, who)
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True

    watcher = asyncio.create_task(watch())
    try:
        return await gateway.infer(call, Caller(who.received, who.authorization, who.request_id, lambda: gone))
    finally:
        watcher.cancel()


# ---- routes ------------------------------------------------------------------------------------------------------


# A direct route's parser without a coroutine: the request's scope, its whole body and the path's parameters as its
# Call, or None to leave the request to the route's ASGI way (e.g. a form body).
Prepare = Callable[[Scope, bytes, dict[str, Any]], "Call | None"]
Render = Callable[[Answer], Response]


class GatewayRoute(Route):
    """A Starlette route through the gateway; ``direct``: answered by :class:`DirectRoutes` ahead of the router, and,
    with ``start`` (made from a ``prepare``), below ASGI by servetune's HTTP protocol."""

    direct = False
    start: Callable[[dict[str, Any], OneWriteCycle], ASGIApp | None] | None = None


def route(
    gateway: Gateway,
    path: str,
    endpoint: Endpoint,
    methods: Sequence[str],
    access: Access,
    errors: ErrorShape = error_response,
    *,
    direct: bool = False,
    prepare: Prepare | None = None,
    render: Render = answer_response,
) -> GatewayRoute:
    """A route through the gateway: the token ``access`` needs, then ``endpoint(request, caller)``; an ApiError is
    answered in ``errors``' shape; the answer's status is counted by the gateway. ``direct``: a hot route, matched
    before Starlette's router (:class:`DirectRoutes`); ``prepare`` (a direct route's): the same request parsed
    without a coroutine, its answer made by ``render``, for servetune's HTTP protocol to run below ASGI."""

    async def guarded(request: Request) -> Response:
        try:
            who = caller(request, time.perf_counter())
            gateway.authorize(access, who.authorization)
        except ApiError as exc:
            return errors(exc)
        try:
            response = await endpoint(request, who)
        except ApiError as exc:
            response = errors(exc)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this request's own task is cancelled (shutdown): not a client that went away
            return Response(b"", CLIENT_GONE)  # the client went away before its batch was sent: nobody to answer
        gateway.count(access, response.status_code)
        return response

    made = GatewayRoute(path, guarded, methods=list(methods))
    made.direct = direct
    if direct and prepare is not None and gateway.submits:
        made.start = DirectCall(gateway, access, errors, prepare, render).start
    return made


class DirectCall:
    """A direct route's request below ASGI (``http1.DirectStart``): what :func:`route`'s ``guarded`` and its
    endpoint do, without a coroutine: the token, the body within ``max_request_size``, the route's ``prepare``, the
    gateway's ``submit``; the answer, rendered, written from the future's callback in one write. Every rule of the
    ASGI way holds (the error shapes, the status count, 499 for a client gone before its batch was sent); a request
    ``prepare`` declines (a form body) is handed to the regular app. Made only over a backend that can ``submit``
    (not Ray's: its requests never wait below ASGI)."""

    __slots__ = ("gateway", "access", "errors", "prepare", "render")

    def __init__(self, gateway: Gateway, access: Access, errors: ErrorShape, prepare: Prepare, render: Render) -> None:
        self.gateway = gateway
        self.access = access
        self.errors = errors
        self.prepare = prepare
        self.render = render

    def start(self, params: dict[str, Any], cycle: OneWriteCycle) -> ASGIApp | None:
        gateway, scope = self.gateway, cast(Scope, cycle.scope)
        try:
            who = caller_of(scope["headers"], time.perf_counter(), scope.get(CLIENT_GONE_KEY))
            gateway.authorize(self.access, who.authorization)
        except ApiError as exc:
            return self.errors(exc)
        body = bytes(cycle.body)
        try:
            if len(body) > gateway.config.max_request_size:
                raise ApiError.too_large(gateway.config.max_request_size)
            call = self.prepare(scope, body, params)
            submitted = None if call is None else gateway.submit(call, who)
        except ApiError as exc:
            response = self.errors(exc)
            gateway.count(self.access, response.status_code)
            return response
        if call is None or submitted is None:
            return REGULAR_APP
        future, job = submitted
        job.on_answer = answer = partial(self._answer, cycle, call, who, job)  # the answer's write, without a turn
        future.add_done_callback(answer)
        return None

    def _answer(
        self, cycle: OneWriteCycle, call: Call, who: Caller, job: InferRequest, future: asyncio.Future[InferResult]
    ) -> None:
        response: Response
        if future.cancelled():  # the client went away before its batch was sent: nobody to answer
            response = Response(b"", CLIENT_GONE)
        else:
            try:
                response = self.render(self.gateway.settled(call, who, job, future))
            except ApiError as exc:
                response = self.errors(exc)
            except Exception:
                log.exception("a prediction's answer failed")
                response = PlainTextResponse("Internal Server Error", status_code=500)
        self.gateway.count(self.access, response.status_code)
        if isinstance(response, WholeResponse):
            cycle.write_now(response.status_code, response.fields, response.body)
        else:
            cycle.run(response)


def route_path(scope: Scope) -> str:
    """The path a router matches: ``path`` less ``root_path`` (an app mounted under a prefix, as behind Ray's proxy),
    as Starlette's router computes it."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    if path == root:
        return ""
    return path[len(root) :] if path[len(root)] == "/" else path


class DirectRoutes:
    """``app`` (a Starlette app of ``routes``) with its direct routes (``route(..., direct=True)``) answered first,
    without the router and middleware: the route's own ``guarded`` function runs on a Starlette Request, so the token,
    the error shapes, the 499 and the status count are the route's; an exception it does not answer (a bug) gets the
    500 Starlette's ServerErrorMiddleware would send, and is raised on for the server to log. A request no direct
    route takes (another path, another method) goes to ``app`` untouched, where the router answers it (its 405
    too). :meth:`match` is the protocol's way to the routes that can also run below ASGI (``http1.DirectMatch``)."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = [
            (r.path_regex, frozenset(r.methods or ()), r.param_convertors, r.endpoint, r.start)
            for r in routes
            if isinstance(r, GatewayRoute) and r.direct
        ]

    def _find(self, method: str, path: str) -> tuple[Any, dict[str, Any]] | None:
        for regex, methods, convertors, endpoint, start in self.routes:
            if method not in methods:
                continue
            match = regex.match(path)
            if match is not None:
                params = {k: convertors[k].convert(v) for k, v in match.groupdict().items()}
                return (endpoint, start), params
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._find(scope["method"], route_path(scope)) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        (endpoint, _), scope["path_params"] = found
        try:
            response = await endpoint(Request(scope, receive, send))
        except Exception:
            await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
            raise
        await response(scope, receive, send)

    def match(self, scope: Scope) -> Callable[[OneWriteCycle], ASGIApp | None] | None:
        """The start of the request below ASGI, if a direct route with a ``prepare`` takes it (its path less one
        trailing slash, as ``without_trailing_slash`` routes it)."""
        path = route_path(scope)
        if len(path) > 1 and path.endswith("/"):
            path = path.rstrip("/") or "/"
        found = self._find(scope["method"], path)
        if found is None or found[0][1] is None:
            return None
        (_, start), params = found
        scope["path_params"] = params
        return partial(start, params)


def with_direct_routes(app: ASGIApp, routes: Sequence[BaseRoute]) -> ASGIApp:
    """``app`` with its direct routes answered first (:class:`DirectRoutes`); ``app`` itself when there are none."""
    direct = DirectRoutes(app, routes)
    return direct if direct.routes else app


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
    "CLIENT_GONE",
    "NO_CACHE_HEADERS",
    "DirectCall",
    "DirectRoutes",
    "Endpoint",
    "ErrorShape",
    "answer_response",
    "caller",
    "caller_of",
    "decompress",
    "error_response",
    "exception_handlers",
    "GatewayRoute",
    "header_problem",
    "header_value",
    "headers_dict",
    "infer",
    "json_response",
    "kserve_error_response",
    "read_body",
    "request_headers",
    "route",
    "route_path",
    "with_direct_routes",
    "without_trailing_slash",
    "WholeResponse",
]
