"""What the built-in engine's loops send: one request (:class:`RequestSender`) or a whole pipeline
(``pipeline.PipelineSender``), behind one small contract."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Protocol

from servetune.bench.http11 import Http11Pool, encode_request
from servetune.bench.payload import Payload
from servetune.bench.recording import CONNECTION, TIMEOUT, StageCall
from servetune.bench.spec import BenchSpec
from servetune.timing import read_timing

_NAN = math.nan

# What one send returns: status, queue ms, handler ms, batch size, and a pipeline's stage calls
Sent = tuple[int, float, float, int, tuple[StageCall, ...]]


class Sender(Protocol):
    """What the engine's loops call; whoever made a sender closes it."""

    warnings: list[str]  # said once in the result, e.g. a pipeline hook that raised

    async def send(self, i: int) -> Sent: ...


class RequestSender:
    """Sends request ``i`` (payloads cycled) and returns (status, queue ms, handler ms, batch size, ())."""

    def __init__(self, spec: BenchSpec, payloads: Sequence[Payload]) -> None:
        limit = spec.clients if spec.mode == "closed" else spec.max_connections
        self.pool = Http11Pool(spec.url, limit, spec.timeout)
        self.warnings: list[str] = []
        method = spec.method.upper()
        self.requests = []
        for payload in payloads:
            headers = list(spec.headers)
            if payload.content_type and method != "GET":
                if not any(name.lower() == "content-type" for name, _ in headers):
                    headers.append(("Content-Type", payload.content_type))
            body = None if method == "GET" else payload.body
            self.requests.append(encode_request(method, spec.url, headers, body))

    async def send(self, i: int) -> Sent:
        try:
            status, headers, _ = await self.pool.exchange(self.requests[i % len(self.requests)])
        except (TimeoutError, asyncio.TimeoutError):
            return TIMEOUT, _NAN, _NAN, 0, ()
        except OSError:
            return CONNECTION, _NAN, _NAN, 0, ()
        return (status, *read_timing(headers), ())

    def close(self) -> None:
        self.pool.close()
