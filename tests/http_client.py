"""A tiny blocking HTTP client for tests (urllib), so server tests read like curl sessions."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
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
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None and "Content-Type" not in (headers or {}):
        req.add_header("Content-Type", "application/octet-stream")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as err:
        return Reply(err.code, {k.lower(): v for k, v in err.headers.items()}, err.read())


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
