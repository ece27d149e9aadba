"""uvicorn's HTTP/1.x protocol as servetune serves it: limits on a request's head, HTTP/1.0 keep-alive, and one write
per response. Every HTTP API (inference, management, metrics) runs on :func:`guarded_protocol`'s class.

**Limits on a request's head** (:class:`GuardedHttpToolsProtocol`), checked where its bytes arrive, before uvicorn
buffers it: size, line length, header count, the time to finish it, and transfer codings.

- the request line and each header line at most ``line`` bytes, the whole head at most ``size`` bytes, at most
  ``count`` headers: else **431** Request Header Fields Too Large (414 URI Too Long for the request line), sent
  before the rest of the head is read; then the connection closes (what the client still sends is dropped for up to
  :data:`LINGER_S` first, so that a reset does not destroy the answer);
- the head finished within ``timeout_s`` of the connection opening (first request) or of its first byte (later
  requests on a kept-alive connection): else **408** Request Timeout (or a plain close when nothing was sent);
- ``Transfer-Encoding`` other than ``chunked``: **501** Not Implemented (RFC 9112 section 6.1; a gzip transfer
  coding would reach the handler undecoded).

While the head is incomplete, data is handed to the parser in slices of at most :data:`SLICE` bytes and the counts
are checked between slices, so a refused head costs at most the limit plus one slice; once the head is complete the
rest of a read goes to the parser whole (no cost on bodies). Error bodies take the API's shape: ``{"error": ...}``
under ``/v1/`` and ``/v2/`` (KServe), TorchServe's ``{"code", "type", "message"}`` elsewhere.

**HTTP/1.0 keep-alive**, so that ``ab -k`` (TorchServe's benchmark method) reuses its connections.

ab speaks HTTP/1.0 and asks for ``Connection: Keep-Alive``. Netty (TorchServe), nginx and Apache keep such a
connection open when the response can be delimited; uvicorn closes every HTTP/1.0 connection (httptools:
``keep_alive=http_version != "1.0" and ...``; h11 never keeps HTTP/1.0 alive), so each ab request paid for a new
TCP connection and ab reported ``Keep-Alive requests: 0``. The rule here, per RFC 7230 section 6.3 and appendix
A.1.2 (HTTP/1.0 keep-alive):

- HTTP/1.0 with a ``keep-alive`` token in ``Connection`` (any case, and no ``close`` token): a response with a
  ``Content-Length`` (or no body: HEAD, 204, 304) gets ``Connection: keep-alive`` and the connection stays open;
- a response without ``Content-Length`` on HTTP/1.0 (streaming) is sent unframed and the connection closes after
  it: HTTP/1.0 has no chunked encoding;
- HTTP/1.0 without keep-alive closes after the response, as before; HTTP/1.1 is untouched.

``KeepAliveHttpToolsProtocol`` and ``KeepAliveH11Protocol`` (for ``http="h11"``) subclass uvicorn's own protocols and
change only what HTTP/1.0 needs; HTTP/1.1 requests pay one dict lookup (httptools) or one type check per event (h11).

**One write per response** (:class:`OneWriteCycle`).

uvicorn writes the status line and headers as soon as the application sends ``http.response.start``, and the body
at ``http.response.body``: two writes, and with TCP_NODELAY two segments, for every prediction's answer (a few
hundred bytes). :class:`OneWriteCycle` holds the head of a response that declares its ``Content-Length`` (the whole
body follows at once) and writes it with the first body bytes; a response without a length (streaming) gets its
head at once, as before, so that a client sees it before the first part comes.

A prediction's answer skips even that: its headers are rendered and checked once where the answer is made
(``api/rest.py``'s ``answer_response``) and written with the body by :meth:`OneWriteCycle.write_whole`, which the
protocol puts in the scope (:data:`WRITE_WHOLE_KEY`): no ASGI messages, no held head, and no second check of each
header by uvicorn's regular expressions.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from h11._events import Event
from starlette.responses import PlainTextResponse
from uvicorn._types import ASGISendEvent, HTTPResponseStartEvent
from uvicorn.config import Config
from uvicorn.protocols.http import h11_impl, httptools_impl
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.server import ServerState


class _Held:
    """The transport while a response's head is written: the bytes are kept, nothing is sent."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.parts.append(bytes(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Prefixed:
    """The transport while the body is written: the held head goes out with the first bytes, or alone before a close
    or when the cycle wrote no body (a HEAD request)."""

    def __init__(self, transport: Any, head: bytes) -> None:
        self._transport = transport
        self.head: bytes | None = head

    def write(self, data: bytes) -> None:
        head, self.head = self.head, None
        self._transport.write(head + data if head is not None else data)

    def flush(self) -> None:
        head, self.head = self.head, None
        if head is not None:
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteCycle(httptools_impl.RequestResponseCycle):
    """uvicorn's request/response cycle (httptools), writing a framed response's head with its body."""

    _head: bytes | None = None
    run: Callable[[Any], None]  # a direct route's request: run an ASGI app for it (set when its body is in)

    async def write_whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole response in one write, as ``send`` would write ``http.response.start`` and one
        ``http.response.body``, less the per-header checks: the caller gives lower-case names and values it checked
        (no CR, LF or control character), without ``content-length``, ``connection`` or ``transfer-encoding``, for
        a status that has a body. The connection is kept or closed as ``send`` would (HTTP/1.0 keep-alive too)."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        self.write_now(status, headers, body)

    def write_now(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """:meth:`write_whole` without waiting for the client to read what was written before (a direct route's
        answer, from a callback: the one request of its connection, so at most this answer waits in the buffer)."""
        if self.disconnected:
            return
        if self.response_started:
            raise RuntimeError("write_whole after the response started")
        self.response_started = True
        self.waiting_for_100_continue = False
        parts = [httptools_impl.STATUS_LINE[status]]
        for name, value in (*self.default_headers, *headers):
            parts += (name, b": ", value, b"\r\n")
        parts.append(b"content-length: %d\r\n" % len(body))
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        elif self.scope["http_version"] == "1.0":
            parts.append(b"connection: keep-alive\r\n")
        parts += (b"\r\n", body)
        self.transport.write(b"".join(parts))
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            headers: Iterable[tuple[bytes, bytes]] = message.get("headers", ())
            if not any(name.lower() == b"content-length" for name, _ in headers):
                await super().send(message)
                return
            transport = self.transport
            held = _Held(transport)
            self.transport = held  # type: ignore[assignment]
            try:
                await super().send(message)
            finally:
                self.transport = transport
            self._head = b"".join(held.parts)
            return
        head, self._head = self._head, None
        if head is None:
            await super().send(message)
            return
        transport = self.transport
        prefixed = _Prefixed(transport, head)
        self.transport = prefixed  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = transport
            if not self.disconnected:
                prefixed.flush()


_NO_BODY_STATUS = (204, 304)
# The scope key of a callable that says whether the client has gone (the connection closed): set by
# KeepAliveHttpToolsProtocol for every request.
CLIENT_GONE_KEY = "servetune.client_gone"
# The scope key of the cycle's :meth:`OneWriteCycle.write_whole` (a whole response in one write, its headers checked
# by the caller): set by KeepAliveHttpToolsProtocol; absent under another server (Ray's proxy).
WRITE_WHOLE_KEY = "servetune.write_whole"


# A direct route (``api/rest.py``'s ``DirectRoutes``): given a request's scope once its head is parsed, the function
# that starts it once its whole body is in (``cycle.body``), or None when the request is not one of its. That
# function either takes the request, answering later with ``cycle.write_now`` or ``cycle.run(asgi_app)``, and
# returns None; or returns an ASGI app that the protocol runs for the request as for any other (an error's response,
# or the regular app when the route declines it).
DirectStart = Callable[["OneWriteCycle"], Any]  # -> an ASGI app, or None


async def REGULAR_APP(scope: Any, receive: Any, send: Any) -> None:  # noqa: N802 (a marker, named as a constant)
    """What a direct route's start returns to leave its request to the app the server runs (never called)."""
    raise RuntimeError("REGULAR_APP is a marker: the protocol runs its own app instead")


DirectMatch = Callable[[Any], "DirectStart | None"]
# the largest body a direct route waits for before it starts (uvicorn pauses reading past it: larger bodies take the
# ASGI way, read as they arrive)
DIRECT_BODY_MAX = HIGH_WATER_LIMIT


def _small_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """The request declares a body of at most :data:`DIRECT_BODY_MAX` bytes and no transfer coding."""
    length = None
    for name, value in headers:
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return False
            length = int(value)
        elif name == b"transfer-encoding":
            return False
    return length is not None and length <= DIRECT_BODY_MAX


def wants_keep_alive(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether an HTTP/1.0 request asks to keep its connection: a ``keep-alive`` token and no ``close`` token.

    ``headers`` are (lower-case name, value) pairs, as uvicorn's scope and h11 hold them.
    """
    tokens: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            tokens.update(token.strip().lower() for token in value.split(b","))
    return b"keep-alive" in tokens and b"close" not in tokens


class _Http10Cycle(OneWriteCycle):
    """uvicorn's request/response cycle for an HTTP/1.0 request (httptools).

    uvicorn would frame a response without ``Content-Length`` with chunked encoding, which HTTP/1.0 clients do not
    know: such a body is sent as it is, and the connection closes to end it.
    """

    close_delimited = False

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            message = self._frame(message)
        elif self.close_delimited and message["type"] == "http.response.body":
            # uvicorn checks every unchunked body against a Content-Length; a close-delimited body has none, so
            # each part declares its own length.
            self.expected_content_length = len(message.get("body", b""))
        await super().send(message)

    def _frame(self, message: HTTPResponseStartEvent) -> HTTPResponseStartEvent:
        headers = list(message.get("headers", ()))
        status = message["status"]
        framed = self.scope["method"] == "HEAD" or status in _NO_BODY_STATUS
        has_connection = False
        for name, _ in headers:
            lname = name.lower()
            if lname == b"content-length":
                framed = True
            elif lname == b"connection":
                has_connection = True  # the application's own choice (e.g. close): uvicorn honours it
        if not framed:
            self.keep_alive = False
            self.close_delimited = True
            self.chunked_encoding = False  # stops uvicorn adding Transfer-Encoding: chunked
            return message
        if self.keep_alive and not has_connection:
            headers.append((b"connection", b"keep-alive"))
            return {**message, "headers": headers}
        return message


class KeepAliveHttpToolsProtocol(httptools_impl.HttpToolsProtocol):
    """uvicorn's httptools protocol, keeping HTTP/1.0 connections that ask for it (see the module docstring), and
    answering the direct routes below ASGI (``direct``, set on the subclass :func:`guarded_protocol` makes)."""

    direct: DirectMatch | None = None
    _deferred: tuple[OneWriteCycle, DirectStart] | None = None  # a direct request whose body is still arriving
    _heading = False  # within on_headers_complete: a task started now is a new request's, not a pipelined one's

    def on_headers_complete(self) -> None:
        self._heading = True
        try:
            self._on_headers_complete()
        finally:
            self._heading = False

    def _start_asgi_task(self, cycle: httptools_impl.RequestResponseCycle, app: Any) -> None:
        """uvicorn starts a request's ASGI task when its head is complete; a direct route's request (a body of known,
        modest length, nothing pipelined before it) instead waits for its body and starts in on_message_complete."""
        direct = self.direct
        if direct is not None and self._heading and app is self.app and not cycle.waiting_for_100_continue:
            start = direct(self.scope) if _small_body(self.headers) else None
            if start is not None:
                self._deferred = (cycle, start)  # type: ignore[assignment]  # it becomes a OneWriteCycle just after
                return
        super()._start_asgi_task(cycle, app)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        deferred = self._deferred
        if deferred is None or deferred[0] is not self.cycle:
            return
        self._deferred = None
        cycle, start = deferred
        cycle.run = partial(super()._start_asgi_task, cycle)
        try:
            app: Any = start(cycle)
        except Exception:
            app = PlainTextResponse("Internal Server Error", status_code=500)
            self.logger.exception("the direct route failed")
        if app is not None:
            cycle.run(self.app if app is REGULAR_APP else app)

    def connection_lost(self, exc: Exception | None) -> None:
        self._deferred = None
        super().connection_lost(exc)

    def _on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is None or cycle.scope is not self.scope:  # an upgrade: no cycle was made for this request
            return
        # The API layer reads this instead of watching ``receive()`` with a task per request.
        self.scope[CLIENT_GONE_KEY] = lambda: cycle.disconnected  # type: ignore[literal-required]
        if self.scope["http_version"] != "1.0":
            cycle.__class__ = OneWriteCycle  # a response's head and body in one write (OneWriteCycle)
        else:
            # The cycle's task is scheduled but has not run yet: its send() is looked up on the class when it does.
            cycle.__class__ = _Http10Cycle
            cycle.keep_alive = wants_keep_alive(self.headers)
        self.scope[WRITE_WHOLE_KEY] = cycle.write_whole  # type: ignore[literal-required, attr-defined]


class _KeepAliveH11Connection(h11.Connection):
    """An h11 connection that keeps an HTTP/1.0 connection when the request asks and the response is framed.

    h11 turns keep-alive off on every HTTP/1.0 request (``h11._connection._keep_alive``). Right after it does, and
    before either side can reach DONE, keep-alive is turned back on; the response then gets ``Connection:
    keep-alive`` if it has a ``Content-Length``. Without one, h11 itself sends the body unframed and closes.
    """

    _http10_keep_alive = False
    _http10_head = False

    def next_event(self) -> Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        event = super().next_event()
        if type(event) is h11.Request:
            self._http10_keep_alive = event.http_version == b"1.0" and wants_keep_alive(event.headers)
            self._http10_head = event.method == b"HEAD"
            if self._http10_keep_alive:
                self._cstate.keep_alive = True
        return event

    def send_with_data_passthrough(self, event: Event) -> list[bytes] | None:
        if self._http10_keep_alive and type(event) is h11.Response:
            self._http10_keep_alive = False
            names = [name for name, _ in event.headers]
            framed = b"content-length" in names or self._http10_head or event.status_code in _NO_BODY_STATUS
            if framed and b"connection" not in names:
                event = h11.Response(
                    status_code=event.status_code,
                    headers=[*event.headers.raw_items(), (b"connection", b"keep-alive")],
                    reason=event.reason,
                    http_version=event.http_version,
                )
        return super().send_with_data_passthrough(event)  # what send() calls


class KeepAliveH11Protocol(h11_impl.H11Protocol):
    """uvicorn's h11 protocol, keeping HTTP/1.0 connections that ask for it (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        size = config.h11_max_incomplete_event_size
        self.conn = _KeepAliveH11Connection(h11.SERVER, size if size is not None else DEFAULT_MAX_INCOMPLETE_EVENT_SIZE)


SLICE = 8192
# After a refusal, what the client still sends is read and dropped for a while before the connection closes (as
# nginx's lingering close): closing a socket with unread data sends a reset, which can destroy the answer in flight.
LINGER_S = 2.0
LINGER_BYTES = 64 * 1024 * 1024
_REASONS = {
    408: "Request Timeout",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
}
_TYPES = {
    408: "RequestTimeoutException",
    414: "RequestHeaderTooLargeException",
    431: "RequestHeaderTooLargeException",
    501: "NotImplementedException",
}


@dataclass(frozen=True)
class HeaderLimits:
    """What one request's head may be (config keys ``max_header_line_size``, ``max_header_size``,
    ``max_header_count``, ``header_timeout_ms``; docs/limits.md)."""

    line: int = 8192
    size: int = 65536
    count: int = 100
    timeout_s: float = 20.0


class _Refused(Exception):
    """Raised from a parser callback to stop parsing: the protocol answers ``status`` and closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def refusal(status: int, message: str, url: bytes) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, in the shape of the API the URL belongs to."""
    path = url.split(b"?", 1)[0]
    if path.startswith((b"/v1/", b"/v2/")) or path in (b"/v1", b"/v2"):
        payload: dict[str, Any] = {"error": message}
    else:
        payload = {"code": status, "type": _TYPES.get(status, "BadRequestException"), "message": message}
    body = json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class GuardedHttpToolsProtocol(KeepAliveHttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`HeaderLimits` (see the module); ``limits`` is set on the subclass
    :func:`guarded_protocol` makes."""

    limits = HeaderLimits()

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._in_head = True  # reading a request's head (the first one from the connection's start)
        self._head_bytes = 0  # bytes of this head seen so far
        self._line_bytes = 0  # bytes of the head's current, unfinished line
        self._lines = 0  # finished lines of this head (the request line, then one per header)
        self._refused: tuple[int, str] | None = None  # set by a parser callback that refuses the request
        self._head_timer: asyncio.TimerHandle | None = None
        self._lingering = -1  # bytes dropped since the refusal; -1: not refused

    # ---- the connection ------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering >= 0:  # refused: drop what still arrives, within bounds
            self._lingering += len(data)
            if self._lingering > LINGER_BYTES:
                self.transport.close()
            return
        view = memoryview(data)
        while len(view):
            if not self._in_head:
                super().data_received(view.tobytes())  # a body (and what follows it): whole, as uvicorn reads it
                return
            piece, view = view[:SLICE], view[SLICE:]
            raw = piece.tobytes()
            problem = self._count(raw)
            if problem is not None:
                self._refuse(*problem)
                return
            super().data_received(raw)
            if self.transport.is_closing():
                return

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error; a callback of ours that refused the request answers its own."""
        refused, self._refused = self._refused, None
        if refused is None:
            super().send_400_response(msg)
        else:
            self._refuse(*refused)

    def _count(self, raw: bytes) -> tuple[int, str] | None:
        """Account for a slice of the head before it is parsed: the refusal when it passes a limit, else None."""
        limits = self.limits
        if self._head_bytes == 0:  # the common case, a whole head in one read: checked at C speed
            end = raw.find(b"\r\n\r\n")
            if end >= 0:
                lines = raw[:end].split(b"\r\n")
                if (
                    end + 4 <= limits.size
                    and len(lines) - 1 <= limits.count
                    and max(map(len, lines)) + 1 <= limits.line
                ):
                    self._head_bytes = end + 4
                    return None
        start = 0
        while True:
            newline = raw.find(b"\n", start)
            if newline < 0:
                self._line_bytes += len(raw) - start
                self._head_bytes += len(raw) - start
                return self._check_line() or self._check_size()
            length = self._line_bytes + newline - start
            self._head_bytes += newline + 1 - start
            start = newline + 1
            self._line_bytes = length
            problem = self._check_line()
            if problem is not None:
                return problem
            self._line_bytes = 0
            if length <= 1 and self._lines > 0:  # the empty line: the head ends here, a body may follow
                return self._check_size()
            self._lines += 1
            if self._lines - 1 > limits.count:
                return 431, f"the request has more than max_header_count ({limits.count}) headers"

    def _check_line(self) -> tuple[int, str] | None:
        line = self.limits.line
        if self._line_bytes <= line:
            return None
        if self._lines == 0:
            return 414, f"the request line is longer than max_header_line_size ({line} bytes)"
        return 431, f"a header line is longer than max_header_line_size ({line} bytes)"

    def _check_size(self) -> tuple[int, str] | None:
        if self._head_bytes <= self.limits.size:
            return None
        return 431, f"the request's headers are larger than max_header_size ({self.limits.size} bytes)"

    # ---- parser callbacks ----------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:  # a later request on a kept-alive connection: its head starts now
            self._in_head = True
            self._head_bytes = self._line_bytes = self._lines = 0
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        for name, value in self.headers:
            if name == b"transfer-encoding":
                codings = [c.strip().lower() for c in value.split(b",") if c.strip()]
                unknown = [c.decode("latin-1") for c in codings if c != b"chunked"]
                if unknown:
                    self._refused = 501, f"Transfer-Encoding {', '.join(unknown)} is not supported (only chunked)"
                    raise _Refused(*self._refused)  # the parser stops; send_400_response answers it
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    # ---- refusals and the head's timer ---------------------------------------------------------------------------

    def _refuse(self, status: int, message: str) -> None:
        self._cancel_head_timer()
        self._in_head = False
        if self.transport.is_closing():
            return
        self.transport.write(refusal(status, message, getattr(self, "url", b"")))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()  # the answer, then FIN; the client's further bytes are dropped until it closes
        self._lingering = 0
        self.loop.call_later(LINGER_S, self.transport.close)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self._head_bytes:
            seconds = f"{self.limits.timeout_s:g}"
            self._refuse(408, f"the request's headers did not arrive within header_timeout_ms ({seconds} s)")
        else:
            self.transport.close()  # a connection that never sent a byte: nobody to answer


def guarded_protocol(limits: HeaderLimits, direct: DirectMatch | None = None) -> type[GuardedHttpToolsProtocol]:
    """The protocol class to give ``uvicorn.Config(http=...)`` for these limits (and these direct routes)."""
    routes = None if direct is None else staticmethod(direct)  # a plain function would be bound as a method
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits, "direct": routes})


__all__ = [
    "CLIENT_GONE_KEY",
    "DIRECT_BODY_MAX",
    "SLICE",
    "DirectMatch",
    "REGULAR_APP",
    "DirectStart",
    "WRITE_WHOLE_KEY",
    "GuardedHttpToolsProtocol",
    "HeaderLimits",
    "KeepAliveH11Protocol",
    "KeepAliveHttpToolsProtocol",
    "OneWriteCycle",
    "guarded_protocol",
    "refusal",
    "wants_keep_alive",
]
