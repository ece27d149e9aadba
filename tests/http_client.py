"""A tiny blocking HTTP client for tests (http.client), so server tests read like curl sessions."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


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
