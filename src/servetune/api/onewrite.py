"""A response's head and body in one write: one ``send`` and one TCP segment per response, not two.

uvicorn writes the status line and headers as soon as the application sends ``http.response.start``, and the body
at ``http.response.body``: two writes, and with TCP_NODELAY two segments, for every prediction's answer (a few
hundred bytes). :class:`OneWriteCycle` holds the head of a response that declares its ``Content-Length`` (the whole
body follows at once) and writes it with the first body bytes; a response without a length (streaming) gets its
head at once, as before, so that a client sees it before the first part comes. ``KeepAliveHttpToolsProtocol``
(``servetune.api.keepalive``) gives every request's cycle this class.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http import httptools_impl


class _Held:
    """The transport while a response's head is written: the bytes are kept, nothing is sent."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.parts.append(bytes(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Prefixed:
    """The transport while the body is written: the held head goes out with the first bytes, or alone before a close
    or when the cycle wrote no body (a HEAD request)."""

    def __init__(self, transport: Any, head: bytes) -> None:
        self._transport = transport
        self.head: bytes | None = head

    def write(self, data: bytes) -> None:
        head, self.head = self.head, None
        self._transport.write(head + data if head is not None else data)

    def flush(self) -> None:
        head, self.head = self.head, None
        if head is not None:
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteCycle(httptools_impl.RequestResponseCycle):
    """uvicorn's request/response cycle (httptools), writing a framed response's head with its body."""

    _head: bytes | None = None

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            headers: Iterable[tuple[bytes, bytes]] = message.get("headers", ())
            if not any(name.lower() == b"content-length" for name, _ in headers):
                await super().send(message)
                return
            transport = self.transport
            held = _Held(transport)
            self.transport = held  # type: ignore[assignment]
            try:
                await super().send(message)
            finally:
                self.transport = transport
            self._head = b"".join(held.parts)
            return
        head, self._head = self._head, None
        if head is None:
            await super().send(message)
            return
        transport = self.transport
        prefixed = _Prefixed(transport, head)
        self.transport = prefixed  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = transport
            if not self.disconnected:
                prefixed.flush()


__all__ = ["OneWriteCycle"]
