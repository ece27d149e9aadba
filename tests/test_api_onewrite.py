"""A response's head and body in one write (servetune.api.http1): uvicorn's own cycle, over a transport that
records its writes (the seam: what goes to the socket, write by write). tests/test_api_keepalive.py serves the same
protocol over real sockets."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from servetune.api.http1 import OneWriteCycle


class Recorder:
    """A transport that records each write and the close."""

    def __init__(self) -> None:
        self.events: list[bytes | str] = []

    def write(self, data: bytes) -> None:
        self.events.append(bytes(data))

    def close(self) -> None:
        self.events.append("close")

    def is_closing(self) -> bool:
        return "close" in self.events

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def run(method: str, messages: list[dict[str, Any]], keep_alive: bool = True) -> list[bytes | str]:
    async def main() -> list[bytes | str]:
        transport = Recorder()
        scope = {"type": "http", "method": method, "http_version": "1.1", "path": "/", "query_string": b""}
        cycle = OneWriteCycle(
            scope,  # type: ignore[arg-type]
            transport,  # type: ignore[arg-type]
            FlowControl(transport),  # type: ignore[arg-type]
            logging.getLogger("test"),
            logging.getLogger("test.access"),
            False,
            [(b"server", b"uvicorn")],
            asyncio.Event(),
            False,
            keep_alive,
            lambda: None,
        )
        for message in messages:
            await cycle.send(message)  # type: ignore[arg-type]
        return transport.events

    return asyncio.run(main())


START = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
HEAD = b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-length: 2\r\n\r\n"


def test_a_framed_response_is_one_write() -> None:
    assert run("POST", [START, {"type": "http.response.body", "body": b"OK"}]) == [HEAD + b"OK"]


def test_the_head_goes_out_before_the_close_and_alone_when_there_is_no_body() -> None:
    assert run("POST", [START, {"type": "http.response.body", "body": b"OK"}], keep_alive=False) == [
        HEAD.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n") + b"OK",
        "close",
    ]
    assert run("HEAD", [START, {"type": "http.response.body", "body": b""}]) == [HEAD]  # uvicorn writes no body


@pytest.mark.parametrize("parts", [[b"a", b"b"], [b""]])
def test_a_streamed_response_gets_its_head_at_once(parts: list[bytes]) -> None:
    start = {"type": "http.response.start", "status": 200, "headers": []}
    bodies = [{"type": "http.response.body", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
    events = run("POST", [start, *bodies])
    assert events[0] == b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ntransfer-encoding: chunked\r\n\r\n"
    assert b"".join(e for e in events[1:] if isinstance(e, bytes)).endswith(b"0\r\n\r\n")
