"""A lean HTTP/1.1 client for load generation: keep-alive connections, one pre-encoded write per request.

Why not aiohttp here: under the open loop every microsecond the client spends per request delays the sends due
after it. aiohttp costs about 150 µs of CPU per request (spread over some forty functions: there is no single
hot spot to fix), this client about 50 µs; on a busy 2-core machine at 2,000 req/s that is the difference
between ~40% and ~10% of sends leaving late (benchmarks/bench_ceiling.py). aiohttp is still used for the
one-off calls (/metrics, the management API).

What it does: HTTP/1.1 over TCP (or TLS for https), requests encoded once before the run, responses framed by
Content-Length, chunked encoding or connection close (bodies are read and dropped, or kept for a pool made with
``keep_body``: a pipeline's next request is made from the answer), ``Connection: close``
honoured, one retry when a reused keep-alive connection turns out to have been closed by the server before it
answered. What it does not: redirects (a 3xx is a status like any other), proxies, pipelining, compression.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from urllib.parse import urlsplit

_MAX_HEAD = 1 << 16
Headers = dict[str, str]
_Answer = tuple[int, Headers, bool, bytes]  # status, headers, keep-alive, body (empty unless kept)


def encode_request(method: str, url: str, headers: list[tuple[str, str]], body: bytes | None) -> bytes:
    """The full request, ready for one write (Content-Length is ours; a Host header given replaces ours)."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    given = [(name, value) for name, value in headers if name.lower() != "content-length"]
    lines = [f"{method} {target} HTTP/1.1"]
    if not any(name.lower() == "host" for name, _ in given):
        lines.append(f"Host: {parts.netloc}")
    lines += [f"{name}: {value}" for name, value in given]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


class _Connection(asyncio.Protocol):
    """One keep-alive connection; answers one request at a time (no pipelining)."""

    def __init__(self, keep_body: bool = False) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[_Answer] | None = None
        self.deadline = 0.0  # on the loop's clock: when the answer in flight times out
        self.closed = False
        self.received = False
        self.keep_body = keep_body
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: Headers = {}
        self.remaining = -1  # body bytes still to come; -1: headers not read yet
        self.chunked = False
        self.chunk_data = 0  # in a chunk: its data bytes still to come (``remaining`` counts its CRLF too)
        self.until_close = False
        self.body = bytearray()

    def _take(self, n: int) -> None:
        """Consume ``n`` body bytes from the buffer (kept when the pool asked for bodies)."""
        if self.keep_body:
            self.body += self.buffer[:n]
        del self.buffer[:n]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, data: bytes, waiter: asyncio.Future[_Answer], deadline: float) -> None:
        assert self.transport is not None
        self.waiter, self.deadline, self.received = waiter, deadline, False
        self.transport.write(data)

    def expire(self) -> None:
        self._fail(TimeoutError("no response before the timeout"))

    def data_received(self, data: bytes) -> None:
        self.received = True
        self.buffer += data
        try:
            self._parse()
        except ValueError as exc:
            self._fail(ConnectionError(f"malformed HTTP response: {exc}"))
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.until_close and self.remaining == 0:
            self._done(keep_alive=False)
        else:
            self._fail(ConnectionError("connection closed before the response was complete"))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.waiter = None

    def _done(self, keep_alive: bool) -> None:
        result = (self.status, self.headers, keep_alive and not self.closed, bytes(self.body))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(result)
        self.waiter = None
        self._reset()
        self.buffer.clear()

    def _parse(self) -> None:
        buf = self.buffer
        while True:
            if self.remaining < 0:  # status line and headers
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _MAX_HEAD:
                        raise ValueError("headers too long")
                    return
                lines = buf[:end].decode("latin-1").split("\r\n")
                del buf[: end + 4]
                self.status = int(lines[0].split(" ", 2)[1])
                self.headers = headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.rstrip().lower()] = value.strip()
                if 100 <= self.status < 200:  # interim response: the real one follows
                    continue
                self._framing()
            if self.chunked:
                self._chunk()
                return
            if self.until_close:
                self._take(len(buf))
                self.remaining = 0
                return
            if len(buf) < self.remaining:
                return
            self._take(self.remaining)
            self._done(keep_alive=self.headers.get("connection", "").lower() != "close")
            return

    def _framing(self) -> None:
        if self.status in (204, 304):
            self.remaining = 0
        elif "chunked" in self.headers.get("transfer-encoding", "").lower():
            self.chunked, self.remaining = True, 0
        elif "content-length" in self.headers:
            self.remaining = int(self.headers["content-length"])
        else:
            self.until_close, self.remaining = True, 0

    def _chunk(self) -> None:
        """Consume the chunked body received so far; complete the response at its last chunk."""
        buf = self.buffer
        while True:
            if self.remaining > 0:  # inside a chunk (its data and CRLF)
                take = min(self.remaining, len(buf))
                data = min(take, self.chunk_data)
                self._take(data)
                del buf[: take - data]
                self.chunk_data -= data
                self.remaining -= take
                if self.remaining:
                    return
            end = buf.find(b"\r\n")
            if end < 0:
                return
            size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
            if size == 0:  # the last chunk: then trailer lines, if any, and an empty line
                if buf[end + 2 : end + 4] != b"\r\n" and buf.find(b"\r\n\r\n", end + 2) < 0:
                    return
                self.chunked = False
                self._done(keep_alive=self.headers.get("connection", "").lower() != "close")
                return
            del buf[: end + 2]
            self.remaining, self.chunk_data = size + 2, size


class Http11Pool:
    """Keep-alive connections to one origin, at most ``limit`` open; requests beyond wait for a free one.

    Timeouts: one sweep over the answers in flight every ``timeout / 10`` (at most ``SWEEP_S``) fails those past
    their deadline, rather than a timer per request (a timer set and cancelled per request cost ~8 us of the
    client's CPU, a quarter of a blocking client's whole cost per request); a request times out at most one sweep
    late."""

    SWEEP_S = 0.05

    def __init__(self, url: str, limit: int, timeout: float, *, keep_body: bool = False) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.limit = limit
        self.timeout = timeout
        self.keep_body = keep_body
        self.open = 0
        self.idle: list[_Connection] = []
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.busy: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    async def request(self, data: bytes) -> tuple[int, Headers]:
        """Send one encoded request; return (status, lower-cased headers). Raises TimeoutError or OSError."""
        status, headers, _ = await self.exchange(data)
        return status, headers

    async def exchange(self, data: bytes) -> tuple[int, Headers, bytes]:
        """Send one encoded request; return (status, lower-cased headers, body: empty unless the pool keeps
        bodies). Raises TimeoutError or OSError."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        for attempt in (0, 1):
            conn = self._idle()
            reused = conn is not None
            if conn is None:
                conn, reused = await self._acquire(deadline)
            waiter: asyncio.Future[_Answer] = loop.create_future()
            conn.send(data, waiter, deadline)
            self.busy.add(conn)
            if self._sweeper is None:
                self._sweeper = loop.call_later(self._tick(), self._sweep, loop)
            try:
                status, headers, keep_alive, body = await waiter
            except ConnectionError:
                self._release(conn, False)
                if reused and not conn.received and attempt == 0:
                    continue  # the server had closed this idle connection: try a fresh one once
                raise
            except BaseException:
                self._release(conn, False)
                raise
            self._release(conn, keep_alive)
            return status, headers, body
        raise AssertionError("unreachable")

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail the answers past their deadline; sweep again while any is in flight."""
        self._sweeper = None
        if not self.busy:
            return
        now = loop.time()
        for conn in [c for c in self.busy if c.deadline <= now]:
            conn.expire()
        self._sweeper = loop.call_later(self._tick(), self._sweep, loop)

    def _tick(self) -> float:
        return max(0.001, min(self.SWEEP_S, self.timeout / 10))

    def _idle(self) -> _Connection | None:
        """An idle connection still open, if there is one (those the server closed meanwhile are dropped)."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
            self.open -= 1
        return None

    async def _acquire(self, deadline: float) -> tuple[_Connection, bool]:
        loop = asyncio.get_running_loop()
        while True:
            idle = self._idle()
            if idle is not None:
                return idle, True
            if self.open < self.limit:
                self.open += 1
                try:
                    _, conn = await asyncio.wait_for(
                        loop.create_connection(lambda: _Connection(self.keep_body), self.host, self.port, ssl=self.ssl),
                        max(0.0, deadline - loop.time()),
                    )
                except BaseException:
                    self.open -= 1
                    self._wake()
                    raise
                return conn, False
            waiter = loop.create_future()
            self.waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise TimeoutError("no free connection before the timeout") from None

    def _release(self, conn: _Connection, reusable: bool) -> None:
        self.busy.discard(conn)
        if reusable and not conn.closed:
            self.idle.append(conn)
        else:
            if conn.transport is not None and not conn.closed:
                conn.transport.close()
            self.open -= 1
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()
