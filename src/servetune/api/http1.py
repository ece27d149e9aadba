"""uvicorn's HTTP/1.x protocol as servetune serves it: HTTP/1.0 keep-alive, one write per response, and the direct
routes below ASGI. Every HTTP API (inference, management, metrics) runs on a subclass of it with limits on a
request's head (``api/http_limits.py``).

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

**A whole direct request in one read** (:meth:`KeepAliveHttpToolsProtocol.direct_whole`): a keep-alive client that
sends a small prediction writes its head and body at once, and the read holds exactly that request. Such a read is
parsed by a parser of its own (httptools, as uvicorn's) whose callbacks only collect the request; when it is one
whole request that a direct route takes, the protocol makes its scope and cycle as uvicorn would and starts the
route, without uvicorn's per-request callbacks, and its own parser never sees the bytes (it stays between requests).
Anything else (part of a request, more than one, a body past :data:`DIRECT_BODY_MAX`, ``Expect``, an upgrade, a
transfer coding, a parser error, a path no direct route takes) is handed to the usual way untouched, as if the fast
way had not looked. In process it costs the protocol ~29 µs a request where the usual way costs ~38
(``benchmarks/http_protocol.py``; docs/server.md, "A whole request in one read").
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, cast

import h11
import httptools
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
    keep = False
    for name, value in headers:
        if name == b"connection":
            for token in value.lower().split(b","):
                token = token.strip()
                if token == b"close":
                    return False
                keep = keep or token == b"keep-alive"
    return keep


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


# headers that send a request the usual way: its body or its connection is not a plain one
_NOT_WHOLE = frozenset((b"expect", b"transfer-encoding", b"upgrade"))


class _WholeRequest:
    """httptools' callbacks that only collect one request (the fast way's parser, :meth:`direct_whole`): its target,
    its headers as uvicorn holds them (lower-case names, values without trailing blanks), its body, and how many
    messages began and ended in what was fed."""

    __slots__ = (
        "parser", "url", "headers", "body", "begun", "complete", "method", "version", "keep_alive", "upgrade", "plain"
    )  # fmt: skip

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.begun = self.complete = 0
        self.method = b""
        self.version = "1.1"
        self.keep_alive = self.upgrade = False
        self.plain = True  # no header that sends the request the usual way (_NOT_WHOLE)

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.body = b""
        self.plain = True
        self.begun += 1

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _NOT_WHOLE:
            self.plain = False
        self.headers.append((name, value.rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        # what the parser says of the request, read while it says it of this one (after the message it is reset)
        parser = self.parser
        self.method = parser.get_method()
        self.version = parser.get_http_version()
        self.keep_alive = parser.should_keep_alive()
        self.upgrade = parser.should_upgrade()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete += 1

    def one(self, data: bytes) -> bool:
        """Parse ``data``: True when it was exactly one whole request (the parser is then between requests again)."""
        self.begun = self.complete = 0
        self.parser.feed_data(data)
        return self.begun == 1 and self.complete == 1


class KeepAliveHttpToolsProtocol(httptools_impl.HttpToolsProtocol):
    """uvicorn's httptools protocol, keeping HTTP/1.0 connections that ask for it (see the module docstring), and
    answering the direct routes below ASGI (``direct``, set on the subclass ``http_limits.guarded_protocol`` makes)."""

    direct: DirectMatch | None = None
    _deferred: tuple[OneWriteCycle, DirectStart] | None = None  # a direct request whose body is still arriving
    _whole: _WholeRequest | None = None  # the fast way's parser (direct_whole), made at its first use
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
        self._begin(*deferred)

    def _begin(self, cycle: OneWriteCycle, start: DirectStart) -> None:
        """Start a direct route's request whose body is in: it answers later, or names the ASGI app to run for it."""
        cycle.run = partial(super()._start_asgi_task, cycle)
        try:
            app: Any = start(cycle)
        except Exception:
            app = PlainTextResponse("Internal Server Error", status_code=500)
            self.logger.exception("the direct route failed")
        if app is not None:
            cycle.run(self.app if app is REGULAR_APP else app)

    def direct_whole(self, data: bytes) -> bool:
        """Start ``data`` on its direct route when it is exactly one whole request that one takes (see the module);
        False when it is not, having changed nothing: the caller then parses it the usual way. The caller checked
        that the connection is between requests (none being answered, none queued) and the head's limits."""
        whole = self._whole
        if whole is None:
            whole = self._whole = _WholeRequest()
        try:
            if not whole.one(data):
                self._whole = None  # part of a request, or more than one: a fresh parser next time
                return False
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):  # the usual way answers it, as uvicorn does
            self._whole = None
            return False
        if not whole.plain or whole.upgrade or len(whole.body) > DIRECT_BODY_MAX or self.limit_concurrency is not None:
            return False
        try:
            url = httptools.parse_url(whole.url)
            path = url.path.decode("ascii")
        except (httptools.HttpParserInvalidURLError, UnicodeDecodeError):
            return False
        if "%" in path:
            path = urllib.parse.unquote(path)
        raw_path, root = url.path, self.root_path
        if root:
            path, raw_path = root + path, root.encode("ascii") + raw_path
        headers, version = whole.headers, whole.version
        scope: Any = {  # as uvicorn's on_message_begin and on_headers_complete make it
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": root,
            "headers": headers,
            "state": self.app_state.copy(),
            "method": whole.method.decode("ascii"),
            "path": path,
            "raw_path": raw_path,
            "query_string": url.query or b"",
        }
        start = self.direct(scope) if self.direct is not None else None
        if start is None:
            return False
        # taken: from here on, as the usual way's callbacks would leave the protocol for this request
        self._unset_keepalive_if_required()
        self.url, self.headers, self.scope = whole.url, headers, scope
        cycle = httptools_impl.RequestResponseCycle(  # as uvicorn's on_headers_complete makes it
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=version != "1.0" and whole.keep_alive,
            on_response=self.on_response_complete,
        )
        cycle.body, cycle.more_body = bytearray(whole.body), False
        cycle.message_event.set()  # the body is in: an ASGI app's ``receive`` has it at once
        self._servetune_cycle(cycle)
        self.cycle = cycle
        self._begin(cast(OneWriteCycle, cycle), start)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._deferred = None
        super().connection_lost(exc)

    def _on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is None or cycle.scope is not self.scope:  # an upgrade: no cycle was made for this request
            return
        self._servetune_cycle(cycle)

    def _servetune_cycle(self, cycle: httptools_impl.RequestResponseCycle) -> None:
        """Make uvicorn's cycle for the request just parsed (``self.scope``, ``self.headers``) servetune's: one write
        per response, HTTP/1.0 keep-alive, and the scope's keys the API layer reads."""
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


__all__ = [
    "CLIENT_GONE_KEY",
    "DIRECT_BODY_MAX",
    "DirectMatch",
    "REGULAR_APP",
    "DirectStart",
    "WRITE_WHOLE_KEY",
    "KeepAliveH11Protocol",
    "KeepAliveHttpToolsProtocol",
    "OneWriteCycle",
    "wants_keep_alive",
]
