"""The lean HTTP/1.1 client against a scripted raw TCP server: framing, keep-alive, retries, timeouts, limits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from servetune.bench.http11 import Http11Pool, encode_request

# path -> the raw bytes the server writes back (each element one write, to split responses across packets)
RESPONSES: dict[str, list[bytes]] = {
    "/length": [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Servetune-Queue-Ms: 1.5\r\n\r\nhello"],
    "/split": [b"HTTP/1.1 201 Created\r\nConte", b"nt-Length: 3\r\n", b"\r\nab", b"c"],
    "/chunked": [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhel", b"lo\r\n6\r\n wor", b"ld\r\n0\r\n\r\n"
    ],
    "/trailers": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Trailer: 1\r\n\r\n"],
    "/continue": [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"],
    "/nocontent": [b"HTTP/1.1 204 No Content\r\n\r\n"],
    "/close": [b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno"],
    "/eof": [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end"],
    "/garbage": [b"NOT HTTP AT ALL\r\n\r\n"],
}  # fmt: skip


class Server:
    """A raw HTTP/1.1 server: answers each request with RESPONSES[path] ('/slow' never answers)."""

    def __init__(self) -> None:
        self.connections = 0
        self.open = 0
        self.peak = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.peak = max(self.peak, self.open)
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                path = head.split(b" ")[1].decode()
                if path == "/slow":
                    await asyncio.sleep(0.3)
                for part in RESPONSES.get(path, RESPONSES["/length"]):
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0.001)
                if path in ("/close", "/eof", "/garbage"):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def run(scenario: Callable[[Server, str], Awaitable[None]]) -> None:
    async def main() -> None:
        server = Server()
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        try:
            await scenario(server, f"http://127.0.0.1:{port}")
        finally:
            listener.close()

    asyncio.run(main())


def test_encode_request() -> None:
    raw = encode_request("POST", "http://h:8080/predictions/m?x=1", [("Content-Type", "text/plain")], b"hi")
    head = b"POST /predictions/m?x=1 HTTP/1.1\r\nHost: h:8080\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n"
    assert raw == head + b"\r\nhi"
    raw = encode_request("GET", "http://h/", [("Host", "other"), ("content-length", "9")], None)
    assert raw == b"GET / HTTP/1.1\r\nHost: other\r\n\r\n"


@pytest.mark.parametrize(
    ("path", "status"),
    [("/length", 200), ("/split", 201), ("/chunked", 200), ("/trailers", 200), ("/continue", 202), ("/nocontent", 204)],
)
def test_framing_keeps_the_connection(path: str, status: int) -> None:
    async def scenario(server: Server, base: str) -> None:
        pool = Http11Pool(base, limit=1, timeout=5)
        request = encode_request("POST", base + path, [], b"x")
        for _ in range(3):
            got, headers = await pool.request(request)
            assert got == status
        assert server.connections == 1 and len(server.requests) == 3  # one keep-alive connection, nothing left over
        pool.close()

    run(scenario)


def test_headers_are_lower_cased() -> None:
    async def scenario(server: Server, base: str) -> None:
        pool = Http11Pool(base, limit=1, timeout=5)
        _, headers = await pool.request(encode_request("GET", base + "/length", [], None))
        assert headers["x-servetune-queue-ms"] == "1.5" and headers["content-length"] == "5"
        pool.close()

    run(scenario)


def test_connection_close_and_close_delimited_bodies_open_new_connections() -> None:
    async def scenario(server: Server, base: str) -> None:
        pool = Http11Pool(base, limit=1, timeout=5)
        assert (await pool.request(encode_request("GET", base + "/close", [], None)))[0] == 503
        assert (await pool.request(encode_request("GET", base + "/eof", [], None)))[0] == 200
        assert (await pool.request(encode_request("GET", base + "/length", [], None)))[0] == 200
        assert server.connections == 3 and pool.open == 1
        pool.close()

    run(scenario)


def test_stale_keep_alive_connection_is_retried_once() -> None:
    async def scenario(server: Server, base: str) -> None:
        pool = Http11Pool(base, limit=1, timeout=5)
        request = encode_request("GET", base + "/length", [], None)
        await pool.request(request)
        server.writers[0].close()  # the server drops the idle connection
        await asyncio.sleep(0.05)
        assert (await pool.request(request))[0] == 200
        assert server.connections == 2
        pool.close()

    run(scenario)


def test_malformed_response_timeout_and_refused_connection() -> None:
    async def scenario(server: Server, base: str) -> None:
        pool = Http11Pool(base, limit=2, timeout=0.1)
        with pytest.raises(ConnectionError, match="malformed"):
            await pool.request(encode_request("GET", base + "/garbage", [], None))
        with pytest.raises(TimeoutError):
            await pool.request(encode_request("GET", base + "/slow", [], None))
        assert pool.open == 0  # both connections were dropped, not pooled
        refused = Http11Pool("http://127.0.0.1:9/", limit=1, timeout=2)
        with pytest.raises(OSError):
            await refused.request(b"GET / HTTP/1.1\r\n\r\n")
        assert refused.open == 0

    run(scenario)


def test_timeouts_are_swept_after_an_idle_spell() -> None:
    """One sweep per pool fails what is past its deadline: it stops while nothing is in flight and starts again
    with the next request; a request times out no earlier than its deadline, and the answer that beat its deadline on
    the other connection is served."""

    async def scenario(server: Server, base: str) -> None:
        loop = asyncio.get_running_loop()
        pool = Http11Pool(base, limit=2, timeout=0.2)
        assert (await pool.request(encode_request("GET", base + "/length", [], None)))[0] == 200
        await asyncio.sleep(0.3)  # the sweep stopped: nothing in flight
        assert pool._sweeper is None
        started = loop.time()
        slow, fast = await asyncio.gather(
            pool.request(encode_request("GET", base + "/slow", [], None)),
            pool.request(encode_request("GET", base + "/length", [], None)),
            return_exceptions=True,
        )
        waited = loop.time() - started
        assert isinstance(slow, TimeoutError) and not isinstance(fast, BaseException) and fast[0] == 200
        assert waited >= 0.2  # not before its deadline (and before /slow's answer at 0.3 s: it timed out)
        assert pool.open == 1 and not pool.busy  # the timed-out connection was dropped, the other kept
        pool.close()
        assert pool._sweeper is None

    run(scenario)


def test_limit_caps_open_connections() -> None:
    async def scenario(server: Server, base: str) -> None:
        pool = Http11Pool(base, limit=2, timeout=5)
        request = encode_request("GET", base + "/split", [], None)
        statuses = await asyncio.gather(*(pool.request(request) for _ in range(10)))
        assert [s for s, _ in statuses] == [201] * 10
        assert server.peak == 2 and server.connections == 2
        pool.close()

    run(scenario)
