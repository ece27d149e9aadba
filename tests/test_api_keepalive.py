"""HTTP/1.0 keep-alive (servetune.api.http1): raw sockets and ``ab -k`` against real servers.

Two layers: uvicorn itself running each keep-alive protocol with a small ASGI app (a fixed-length, a streaming and
a ``Connection: close`` response), and a real ``servetune serve`` whose three APIs are driven as TorchServe's
benchmark drives them (``ab -k``).
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from http_client import uvicorn_thread
from models import sleep_archive
from servetune.api.http1 import KeepAliveH11Protocol, KeepAliveHttpToolsProtocol, wants_keep_alive
from servetune.embedded import EmbeddedServer

# How long a socket read may wait; the servers' keep-alive timeout is longer, so a connection the server wrongly
# kept open shows up as a read timing out here, not as a close.
READ_TIMEOUT_S = 10.0
PROTOCOLS = {"httptools": KeepAliveHttpToolsProtocol, "h11": KeepAliveH11Protocol}


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def exchange(sock: socket.socket, request: bytes) -> Response:
    """Send one request and read one response: framed by Content-Length, or running to the close."""
    sock.sendall(request)
    reader = sock.makefile("rb")
    status = int(reader.readline().split()[1])
    headers: dict[str, str] = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    assert "chunked" not in headers.get("transfer-encoding", ""), "no chunked encoding on these requests"
    if "content-length" in headers:
        body = reader.read(int(headers["content-length"]))
    else:
        body = reader.read()  # close-delimited: the close ends the body (a timeout here means it never closed)
    reader.close()
    return Response(status, headers, body)


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes the connection (after the response just read) within READ_TIMEOUT_S."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except TimeoutError:
        return False


def request(method: str, path: str, version: str, connection: str | None = None, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: 127.0.0.1"]
    if connection is not None:
        lines.append(f"Connection: {connection}")
    if body or method in ("POST", "PUT"):
        lines += ["Content-Type: application/octet-stream", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@contextmanager
def connect(url: str) -> Iterator[socket.socket]:
    host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=READ_TIMEOUT_S) as sock:
        yield sock


# ---- uvicorn with each protocol ---------------------------------------------------------------------------------


async def small_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/fixed``: a Content-Length body; ``/stream``: two parts, no length; ``/close``: the app says close."""
    while (await receive()).get("more_body"):
        pass
    path = scope["path"]
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"part1-", "more_body": True})
        await send({"type": "http.response.body", "body": b"part2", "more_body": False})
        return
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    if path == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok", "more_body": False})


@pytest.fixture(params=sorted(PROTOCOLS))
def small_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """A real uvicorn server on an ephemeral port, in a thread, with one of the keep-alive protocols."""
    with uvicorn_thread(small_app, PROTOCOLS[request.param]) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_http10_keep_alive_is_kept_with_content_length(small_server: str, method: str) -> None:
    with connect(small_server) as sock:
        for _ in range(2):
            reply = exchange(sock, request(method, "/fixed", "1.0", "Keep-Alive", b"x" if method == "POST" else b""))
            assert (reply.status, reply.body) == (200, b"ok")
            assert reply.headers["connection"] == "keep-alive"
            assert reply.headers["content-length"] == "2"


def test_http10_keep_alive_stream_is_close_delimited(small_server: str) -> None:
    with connect(small_server) as sock:
        reply = exchange(sock, request("GET", "/stream", "1.0", "keep-alive"))  # reads the body up to the close
    assert (reply.status, reply.body) == (200, b"part1-part2")
    assert "content-length" not in reply.headers and "transfer-encoding" not in reply.headers
    assert reply.headers["connection"] == "close"


def test_http10_without_keep_alive_stream_is_not_chunked(small_server: str) -> None:
    with connect(small_server) as sock:
        reply = exchange(sock, request("GET", "/stream", "1.0"))  # reads the body up to the close
    assert reply.body == b"part1-part2"
    assert reply.headers["connection"] == "close"


@pytest.mark.parametrize(
    ("path", "version", "connection"),
    [
        ("/fixed", "1.0", None),
        ("/fixed", "1.0", "close"),
        ("/fixed", "1.0", "keep-alive, close"),
        ("/fixed", "1.1", "close"),
        ("/close", "1.0", "keep-alive"),  # the application's Connection: close wins
        ("/close", "1.1", None),
    ],
)
def test_closes_when_either_side_says_so(small_server: str, path: str, version: str, connection: str | None) -> None:
    with connect(small_server) as sock:
        reply = exchange(sock, request("GET", path, version, connection))
        assert (reply.status, reply.body) == (200, b"ok")
        assert reply.headers["connection"] == "close"
        assert closed_by_server(sock)


def test_http11_is_unchanged(small_server: str) -> None:
    with connect(small_server) as sock:
        for _ in range(2):
            reply = exchange(sock, request("GET", "/fixed", "1.1"))
            assert (reply.status, reply.body) == (200, b"ok")
            assert "connection" not in reply.headers


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"keep-alive", True),
        (b"Keep-Alive", True),
        (b"TE, KEEP-ALIVE", True),
        (b"keep-alive, close", False),
        (b"close", False),
        (b"keep-alives", False),
    ],
)
def test_wants_keep_alive_reads_connection_tokens(value: bytes, expected: bool) -> None:
    assert wants_keep_alive([(b"host", b"x"), (b"connection", value)]) is expected


# ---- a real servetune server --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servetune(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """``servetune serve`` with a no-op model (its handler returns at once), token auth off."""
    tmp = tmp_path_factory.mktemp("keepalive")
    sleep_archive(tmp / "store", batch_ms=0)
    properties = {"disable_token_authorization": "true", "default_workers_per_model": "1"}
    with EmbeddedServer(tmp / "store", {"sleep": "sleep.mar"}, properties, workdir=tmp / "server") as server:
        yield server


def predict(version: str, connection: str | None) -> bytes:
    return request("POST", "/predictions/sleep", version, connection, b"hello")


def test_servetune_http10_keep_alive_answers_two_requests_on_one_connection(servetune: EmbeddedServer) -> None:
    with connect(servetune.inference_url) as sock:
        for _ in range(2):
            reply = exchange(sock, predict("1.0", "Keep-Alive"))
            assert reply.status == 200 and b'"echo": "hello"' in reply.body
            assert reply.headers["connection"] == "keep-alive"
            assert int(reply.headers["content-length"]) == len(reply.body)


@pytest.mark.parametrize(("version", "connection"), [("1.0", None), ("1.0", "close"), ("1.1", "close")])
def test_servetune_closes_without_keep_alive(servetune: EmbeddedServer, version: str, connection: str | None) -> None:
    with connect(servetune.inference_url) as sock:
        reply = exchange(sock, predict(version, connection))
        assert reply.status == 200
        assert reply.headers["connection"] == "close"
        assert closed_by_server(sock)


def test_servetune_http11_keeps_the_connection(servetune: EmbeddedServer) -> None:
    with connect(servetune.inference_url) as sock:
        for _ in range(2):
            reply = exchange(sock, predict("1.1", None))
            assert reply.status == 200


def test_servetune_answers_pipelined_predictions_in_order_each_whole(servetune: EmbeddedServer) -> None:
    """Three predictions sent in one write (HTTP/1.1 pipelining) are answered in order on the connection, each with
    one head: the no-cache, timing and request-id headers once, its length, then its body (the answer is written
    whole, ``http1.OneWriteCycle.write_whole``); the connection stays open after them."""
    bodies = [b"one", b"two", b"three"]
    with connect(servetune.inference_url) as sock:
        sock.sendall(b"".join(request("POST", "/predictions/sleep", "1.1", None, body) for body in bodies))
        reader = sock.makefile("rb")
        for body in bodies:
            assert reader.readline() == b"HTTP/1.1 200 OK\r\n"
            names: list[str] = []
            headers: dict[str, str] = {}
            while (line := reader.readline()) != b"\r\n":
                name, _, value = line.decode("latin-1").partition(":")
                names.append(name.strip().lower())
                headers[names[-1]] = value.strip()
            assert sorted(set(names)) == sorted(names), f"a header sent twice: {names}"
            for name in ("pragma", "cache-control", "expires", "x-request-id", "x-servetune-queue-ms"):
                assert name in headers, names
            assert headers["x-servetune-batch-size"] == "1" and "connection" not in headers
            answer = reader.read(int(headers["content-length"]))
            assert f'"echo": "{body.decode()}"'.encode() in answer
        reader.close()
        reply = exchange(sock, predict("1.1", None))  # still open
        assert reply.status == 200


def ab_figures(output: str) -> dict[str, int]:
    figures = {}
    for key, label in (
        ("complete", "Complete requests"),
        ("failed", "Failed requests"),
        ("kept", "Keep-Alive requests"),
    ):
        match = re.search(rf"^{label}:\s+(\d+)", output, re.MULTILINE)
        assert match, f"no {label!r} in ab's report:\n{output}"
        figures[key] = int(match.group(1))
    return figures


@pytest.mark.skipif(shutil.which("ab") is None, reason="needs Apache Bench (apt-get install apache2-utils)")
@pytest.mark.parametrize("api", ["inference", "management", "metrics"])
def test_ab_keep_alive_on_every_api(servetune: EmbeddedServer, tmp_path: Path, api: str) -> None:
    """TorchServe's benchmark method, ``ab -k``: every request after a connection's first reuses it."""
    requests = 200
    cmd = ["ab", "-k", "-c", "4", "-n", str(requests), "-s", "60"]
    if api == "inference":
        body = tmp_path / "body"
        body.write_bytes(b"hello")
        cmd += ["-p", str(body), "-T", "application/octet-stream", f"{servetune.inference_url}/predictions/sleep"]
    elif api == "management":
        cmd.append(f"{servetune.management_url}/models")
    else:
        # -l: the exposition's length changes as the counters grow; ab would call that a "Length" failure
        cmd += ["-l", f"{servetune.metrics_url}/metrics"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    figures = ab_figures(done.stdout)
    assert figures == {"complete": requests, "failed": 0, "kept": requests}, done.stdout
