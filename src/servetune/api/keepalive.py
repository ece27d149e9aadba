"""HTTP/1.0 keep-alive for uvicorn, so that ``ab -k`` (TorchServe's benchmark method) reuses its connections.

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

Pass a protocol class to uvicorn: ``uvicorn.Config(app, http=KeepAliveHttpToolsProtocol)`` (or its import string,
``"servetune.api.keepalive:KeepAliveHttpToolsProtocol"``); ``KeepAliveH11Protocol`` likewise for ``http="h11"``.
They subclass uvicorn's own protocols and change only what HTTP/1.0 needs; HTTP/1.1 requests pay one dict
lookup (httptools) or one type check per event (h11). The httptools protocol also writes each response's head with
its body, in one write (``servetune.api.onewrite``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from h11._events import Event
from uvicorn._types import ASGISendEvent, HTTPResponseStartEvent
from uvicorn.config import Config
from uvicorn.protocols.http import h11_impl, httptools_impl
from uvicorn.server import ServerState

from servetune.api.onewrite import OneWriteCycle

_NO_BODY_STATUS = (204, 304)
# The scope key of a callable that says whether the client has gone (the connection closed): set by
# KeepAliveHttpToolsProtocol for every request.
CLIENT_GONE_KEY = "servetune.client_gone"


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
    """uvicorn's httptools protocol, keeping HTTP/1.0 connections that ask for it (see the module docstring)."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is None or cycle.scope is not self.scope:  # an upgrade: no cycle was made for this request
            return
        # The API layer reads this instead of watching ``receive()`` with a task per request.
        self.scope[CLIENT_GONE_KEY] = lambda: cycle.disconnected  # type: ignore[literal-required]
        if self.scope["http_version"] != "1.0":
            cycle.__class__ = OneWriteCycle  # a response's head and body in one write (servetune.api.onewrite)
            return
        # The cycle's task is scheduled but has not run yet: its send() is looked up on the class when it does.
        cycle.__class__ = _Http10Cycle
        cycle.keep_alive = wants_keep_alive(self.headers)


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


__all__ = ["CLIENT_GONE_KEY", "KeepAliveH11Protocol", "KeepAliveHttpToolsProtocol", "wants_keep_alive"]
