"""The HTTP protocol every API runs on (:func:`guarded_protocol`'s class): ``api/http1.py``'s, with limits on a
request's head and on how long its body may stall.

**Limits on a request's head** (:class:`GuardedHttpToolsProtocol`), checked where its bytes arrive, before uvicorn
buffers it: size, line length, header count, the time to finish it, and transfer codings.

- the request line and each header line at most ``line`` bytes, the whole head at most ``size`` bytes, at most
  ``count`` headers: else **431** Request Header Fields Too Large (414 URI Too Long for the request line), sent
  before the rest of the head is read; then the connection closes (what the client still sends is dropped for up to
  :data:`LINGER_S` first, so that a reset does not destroy the answer);
- the head finished within ``timeout_s`` of the connection opening (first request) or of its first byte (later
  requests on a kept-alive connection): else **408** Request Timeout (or a plain close when nothing was sent);
- a body that sends no byte for ``body_timeout_s`` (between two reads, as nginx's ``client_body_timeout``): **408**,
  then the connection closes, its request dropped as a client that went away is (closed without an answer when the
  request was answered already); time while the server itself stopped reading does not count;
- the bodies still arriving on the port's connections at most ``incoming_bytes`` in all (:class:`Incoming`): the
  body that would pass it gets **503** with ``Retry-After: 1`` at once, and its connection closes;
- ``Transfer-Encoding`` other than ``chunked``: **501** Not Implemented (RFC 9112 section 6.1; a gzip transfer
  coding would reach the handler undecoded).

While the head is incomplete, data is handed to the parser in slices of at most :data:`SLICE` bytes and the counts
are checked between slices, so a refused head costs at most the limit plus one slice; once the head is complete its
body goes to the parser whole (no cost on bodies). Every request of a kept-alive connection is held to the limits:
a read is split where the body its head declared ends, and what follows is the next request's head, counted the same
way (a chunked body's read goes whole, so the head of a request pipelined into that same read is counted from the
next read on: at most one read uncounted). A refusal waits for the answers to the requests before it on the
connection (pipelined), so that answers go out in order. Error bodies take the API's shape: ``{"error": ...}``
under ``/v1/`` and ``/v2/`` (KServe), TorchServe's ``{"code", "type", "message"}`` elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any, cast

from uvicorn.config import Config
from uvicorn.server import ServerState

from servetune.api.http1 import DIRECT_BODY_MAX, DirectMatch, KeepAliveHttpToolsProtocol

SLICE = 8192
# After a refusal, what the client still sends is read and dropped for a while before the connection closes (as
# nginx's lingering close): closing a socket with unread data sends a reset, which can destroy the answer in flight.
LINGER_S = 2.0
LINGER_BYTES = 64 * 1024 * 1024
_REASONS = {
    408: "Request Timeout",
    503: "Service Unavailable",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
}
_TYPES = {
    408: "RequestTimeoutException",
    503: "ServiceUnavailableException",
    414: "RequestHeaderTooLargeException",
    431: "RequestHeaderTooLargeException",
    501: "NotImplementedException",
}


@dataclass(frozen=True)
class HeaderLimits:
    """What one request's head may be, and how long its body may stall (config keys ``max_header_line_size``,
    ``max_header_size``, ``max_header_count``, ``header_timeout_ms``, ``body_timeout_ms``; docs/limits.md)."""

    line: int = 8192
    size: int = 65536
    count: int = 100
    timeout_s: float = 20.0
    body_timeout_s: float = 60.0  # the longest wait between two reads of a body (nginx's client_body_timeout)
    incoming_bytes: int = 1 << 30  # bytes of bodies still arriving over one port's connections: 503 past it
    body_bytes: int = 6553500  # the most of one body a request can hold (``max_request_size``: past it, 413)


class Incoming:
    """The bytes of request bodies still arriving on one port's connections, against ``HeaderLimits.incoming_bytes``.
    A body counts once it takes more than one read: its declared length (chunked: what came of it so far), at most
    ``body_bytes`` (past it the route answers 413 and what still comes is dropped, not held), and nothing once its
    request was answered. Its share goes when it is in (its request then holds it, within ``job_queue_size``) or its
    connection closes."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


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
    retry = "retry-after: 1\r\n" if status == 503 else ""  # busy: another try, here or elsewhere, may go through
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{retry}connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d{1,18})[ \t]*\r\n", re.IGNORECASE)


def _only_its_body(raw: bytes, end: int) -> bool:
    """Whether what follows the head ending at ``end`` in ``raw`` is at most the body the head declares, so that the
    parser can take the whole slice at once (one call per request). A hint only: where the rest may hold the start
    of another request (or the head declares no length), the slice is split at the head's end, and the parser's own
    reading of the head (``_body_left``) decides what the rest is."""
    declared = _CONTENT_LENGTH.search(raw, 0, end)
    return declared is not None and len(raw) - end <= int(declared.group(1))


def _whole_head_end(raw: bytes, limits: HeaderLimits) -> int:
    """Where a head that is whole in ``raw`` ends (after its empty line), when it is within ``limits``; -1 when it is
    not whole there, or passes a limit (the line-by-line count then says which)."""
    end = raw.find(b"\r\n\r\n")
    if end < 0 or end + 4 > limits.size:
        return -1
    lines = raw[:end].split(b"\r\n")
    if len(lines) - 1 > limits.count or max(map(len, lines)) + 1 > limits.line:
        return -1
    return end + 4


def _body_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body a request's head declares: its ``Content-Length`` (0 without one), None when chunked (the parser
    checked the values: one valid length, no length beside a transfer coding)."""
    length = 0
    for name, value in headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            if not value.strip().isdigit():
                return None  # not a length (the parser would have refused it): the read goes to it whole
            length = int(value)
    return length


class GuardedHttpToolsProtocol(KeepAliveHttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`HeaderLimits` (see the module); ``limits`` is set on the subclass
    :func:`guarded_protocol` makes."""

    limits = HeaderLimits()
    incoming = Incoming()

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
        # the bytes of the request's body still to come (its Content-Length), None for a chunked one: a read of a
        # kept-alive connection is split where the body ends, and what follows is counted as the next head
        self._body_left: int | None = 0
        self._head_end = -1  # where the head ends in the slice ``_count`` saw last (-1: not in it)
        self._held: tuple[int, str] | None = None  # a refusal waiting for the answers before it (``_refuse_in_turn``)
        self._in_body = False  # a request's head is in and its body is still coming
        self._body_seen = 0  # bytes of that body received so far
        self._incoming = 0  # this connection's share of ``incoming`` (the port's bodies still arriving)
        self._body_read = 0.0  # the loop's time of the last read while in a body
        self._body_timer: asyncio.TimerHandle | None = None
        self._lingering = -1  # bytes dropped since the refusal; -1: not refused

    # ---- the connection ------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._end_body()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._between_requests() and self._fits(data) and self.direct_whole(data):
            # one whole direct request, within the limits, started (http1.py's fast way): as after a request whose
            # body is in, the next bytes begin the next head
            self._cancel_head_timer()
            self._in_head = False
            return
        self._receive(data)
        # A head that began in this read and is not complete at its end: its time runs from now (one timer per
        # unfinished head, rather than one armed and cancelled for every request whose head came whole)
        if self._in_head and self._head_timer is None and self._lingering < 0 and not self.transport.is_closing():
            self._arm_head_timer()
        elif self._in_body and self._lingering < 0:  # a body that takes more than this read: it may not stall
            self._body_read = self.loop.time()
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_stalled)
            self._count_incoming()

    def _count_incoming(self) -> None:
        """This body's share of the port's bodies still arriving; 503 when they would pass the limit."""
        cycle = self.cycle
        if cycle is not None and cycle.response_started:  # answered already (a 413, a 401): the rest is dropped
            share = 0
        else:
            share = min(self._body_seen + (self._body_left or 0), self.limits.body_bytes)
        incoming = self.incoming
        incoming.total += share - self._incoming
        self._incoming = share
        if incoming.total > self.limits.incoming_bytes:
            limit = self.limits.incoming_bytes
            self._abandon_body(503, f"too many request bodies are arriving at once (max_incoming_bytes: {limit})")

    def _receive(self, data: bytes) -> None:
        if self._lingering >= 0:  # refused: drop what still arrives, within bounds
            self._lingering += len(data)
            if self._lingering > LINGER_BYTES:
                self.transport.close()
            return
        view, pos, size = memoryview(data), 0, len(data)
        while pos < size:
            if not self._in_head:
                upgraded = self.transport.get_protocol()
                if upgraded is not self:  # the head asked for another protocol (a websocket): the rest is its
                    cast(asyncio.Protocol, upgraded).data_received(view[pos:].tobytes())
                    return
                left = self._body_left
                if left is None:  # a chunked body: the rest of the read to the parser whole, as uvicorn reads it
                    super().data_received(data if pos == 0 else view[pos:].tobytes())
                    return
                if left > 0:  # the request's body, to the parser whole; what follows it is the next request's head
                    end = min(size, pos + left)
                    super().data_received(data if pos == 0 and end == size else view[pos:end].tobytes())
                    pos = end
                    if self.transport.is_closing():
                        return
                    continue
                self._begin_head()  # the body is in: these bytes begin the next request's head, counted as they come
            raw = view[pos : pos + SLICE].tobytes()
            problem = self._count(raw)
            if problem is not None:
                self._refuse_in_turn(*problem)
                return
            end = self._head_end
            if 0 <= end < len(raw) and not _only_its_body(raw, end):  # the next request may follow: the head alone
                raw = raw[:end]
            super().data_received(raw)
            pos += len(raw)
            if self.transport.is_closing():
                return

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error; a callback of ours that refused the request answers its own."""
        refused, self._refused = self._refused, None
        if refused is None:
            super().send_400_response(msg)
        else:
            self._refuse_in_turn(*refused)

    def _between_requests(self) -> bool:
        """Nothing of a request has come since the last one was in (or the connection opened), none is being
        answered or queued, nothing refused: a read may begin and end one whole request (the fast way)."""
        if self.direct is None or self._lingering >= 0 or self._held is not None or self.pipeline:
            return False
        if self._in_head:
            if self._head_bytes:
                return False
        elif self._body_left != 0 or self._in_body:
            return False
        cycle = self.cycle
        return (cycle is None or cycle.response_complete) and self._deferred is None

    def _fits(self, data: bytes) -> bool:
        """``data`` is a whole head within the limits (checked as :meth:`_count` checks a head that came whole) and
        then exactly the body its ``Content-Length`` declares, of at most what a direct route waits for: anything
        else is parsed the usual way (which refuses what passes a limit), with no parse spent on it before."""
        if len(data) > SLICE + DIRECT_BODY_MAX or (end := data.find(b"\r\n\r\n")) < 0:
            return False
        declared = _CONTENT_LENGTH.search(data, 0, end + 4)
        if declared is None or len(data) - end - 4 != int(declared.group(1)):
            return False  # a head alone (its body in the next read), or more than one request
        return _whole_head_end(data, self.limits) == end + 4

    def _count(self, raw: bytes) -> tuple[int, str] | None:
        """Account for a slice of the head before it is parsed: the refusal when it passes a limit, else None."""
        limits = self.limits
        self._head_end = -1
        if self._head_bytes == 0:  # the common case, a whole head in one read: checked at C speed
            end = _whole_head_end(raw, limits)
            if end >= 0:
                self._head_bytes = self._head_end = end
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
                self._head_end = start
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
        if not self._in_head:  # the next request began within a chunked body's read (see ``_receive``)
            self._begin_head()
            self._head_bytes = 1  # its bytes in that read went uncounted (one read at most); some did come

    def _begin_head(self) -> None:
        """A later request on a kept-alive connection: its head starts now (its timer is armed at the end of this read
        if the head is still unfinished then)."""
        self._in_head = True
        self._head_bytes = self._line_bytes = self._lines = 0

    def on_body(self, body: bytes) -> None:
        self._body_seen += len(body)
        if self._body_left:
            self._body_left -= len(body)
        super().on_body(body)

    def on_headers_complete(self) -> None:
        for name, value in self.headers:
            if name == b"transfer-encoding":
                codings = [c.strip().lower() for c in value.split(b",") if c.strip()]
                unknown = [c.decode("latin-1") for c in codings if c != b"chunked"]
                if unknown:
                    self._refused = 501, f"Transfer-Encoding {', '.join(unknown)} is not supported (only chunked)"
                    raise _Refused(*self._refused)  # the parser stops; send_400_response answers it
        self._in_head = False
        self._body_left = _body_length(self.headers)
        self._in_body = self._body_left != 0
        self._body_seen = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._end_body()
        super().on_message_complete()

    def _end_body(self) -> None:
        self._in_body = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._release_incoming()

    def _release_incoming(self) -> None:
        """Give back this connection's share of the port's bodies still arriving."""
        if self._incoming:
            self.incoming.total -= self._incoming
            self._incoming = 0

    def _body_stalled(self) -> None:
        """No byte of the body for ``body_timeout_s``: 408 and close (the request is dropped as a client that went
        away is), unless it is the server that stopped reading (a full buffer, a pipelined request's turn)."""
        self._body_timer = None
        if not self._in_body or self.transport.is_closing():
            return
        now, timeout = self.loop.time(), self.limits.body_timeout_s
        if self.flow.read_paused:  # the server's doing: the client's time starts again once reading resumes
            self._body_read = now
        if now - self._body_read < timeout:
            self._body_timer = self.loop.call_later(timeout - (now - self._body_read), self._body_stalled)
            return
        seconds = f"{self.limits.body_timeout_s:g}"
        self._abandon_body(408, f"no byte of the request's body arrived for body_timeout_ms ({seconds} s)")

    def _abandon_body(self, status: int, message: str) -> None:
        """Refuse the request whose body is arriving: ``status`` and close (closed without an answer when it was
        answered already); its app's ``receive`` says the client went away; its share of ``incoming`` goes now."""
        self._end_body()
        self._deferred = None  # a direct route's request waiting for this body: never started
        cycle = self.cycle
        if cycle is not None:
            if cycle.response_started:  # answered already (a 401, a 413) or answering: nothing more to say
                self.transport.close()
                return
            cycle.disconnected = True  # its app's ``receive`` says the client is gone; its answer is not written
            cycle.message_event.set()
        self._refuse(status, message)

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

    def _refuse_in_turn(self, status: int, message: str) -> None:
        """:meth:`_refuse` the head being read, at once or, when a request before it on the connection is still being
        answered (pipelined), right after that answer: answers go out in order. What arrives meanwhile is dropped."""
        if self._answering():
            self._cancel_head_timer()
            self._in_head = False
            self._lingering = 0
            self._held = (status, message)
            return
        self._refuse(status, message)

    def _answering(self) -> bool:
        cycle = self.cycle
        return bool(self.pipeline) or (cycle is not None and not cycle.response_complete)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._release_incoming()  # answered before its body was in (a 413, a 401): what still comes of it is dropped
        held = self._held
        if held is not None and not self._answering():
            self._held = None
            self._refuse(*held)

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
            self._refuse_in_turn(408, f"the request's headers did not arrive within header_timeout_ms ({seconds} s)")
        else:
            self.transport.close()  # a connection that never sent a byte: nobody to answer


def guarded_protocol(limits: HeaderLimits, direct: DirectMatch | None = None) -> type[GuardedHttpToolsProtocol]:
    """The protocol class to give ``uvicorn.Config(http=...)`` for these limits (and these direct routes)."""
    routes = None if direct is None else staticmethod(direct)  # a plain function would be bound as a method
    attributes = {"limits": limits, "direct": routes, "incoming": Incoming()}  # one count per port
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), attributes)


__all__ = ["SLICE", "GuardedHttpToolsProtocol", "HeaderLimits", "guarded_protocol", "refusal"]
