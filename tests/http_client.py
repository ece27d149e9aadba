"""A tiny blocking HTTP client for tests (http.client), so server tests read like curl sessions."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 60.0
) -> Reply:
    """One request on a fresh connection. A server may answer before it has read the whole body (413 on a declared
    length) and close: the answer is read even when sending the rest of the body failed, as curl does."""
    parts = urllib.parse.urlsplit(url)
    headers = dict(headers or {})
    if data is not None and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/octet-stream"
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        try:
            conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=data, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered early and closed; its answer may be waiting
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def burst(
    method: str, url: str, bodies: list[bytes], headers: dict[str, str] | None = None, threads: int | None = None
) -> list[Reply]:
    """Send all bodies at once (one thread each) and return the replies in order."""
    with ThreadPoolExecutor(max_workers=threads or len(bodies)) as pool:
        return list(pool.map(lambda b: call(method, url, b, headers), bodies))


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


@contextmanager
def uvicorn_thread(app: Any, http: Any) -> Iterator[int]:
    """A real uvicorn server of ``app`` with the HTTP protocol class ``http``, on an ephemeral port, in a thread;
    yields the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, http=http, lifespan="off", log_level="warning", access_log=False, loop="asyncio", timeout_keep_alive=60
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
