"""The frontend <-> worker wire format: length-prefixed frames over a socket pair.

    frame   := u32 payload_length | payload
    payload := u32 header_length | header (UTF-8 JSON object) | blob_0 | blob_1 | ...

The header lists the blob lengths under ``"_blobs"``; bodies travel as raw bytes, never pickled. What the
headers say is typed in ``servetune.server.messages``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

from servetune._exceptions import WorkerError

_U32 = struct.Struct("!I")
MAX_FRAME = 1 << 31


class ProtocolError(WorkerError):
    """The peer sent something that is not a frame (or a frame that is not a message)."""


def encode(header: dict[str, Any], blobs: list[bytes] | None = None) -> bytes:
    blobs = blobs or []
    head = json.dumps({**header, "_blobs": [len(b) for b in blobs]}, separators=(",", ":")).encode()
    payload_len = _U32.size + len(head) + sum(len(b) for b in blobs)
    return b"".join([_U32.pack(payload_len), _U32.pack(len(head)), head, *blobs])


def decode(payload: bytes) -> tuple[dict[str, Any], list[bytes]]:
    (head_len,) = _U32.unpack_from(payload, 0)
    start = _U32.size + head_len
    if start > len(payload):
        raise ProtocolError("header longer than the frame")
    header: dict[str, Any] = json.loads(payload[_U32.size : start])
    blobs: list[bytes] = []
    for size in header.pop("_blobs", []):
        blobs.append(payload[start : start + size])
        start += size
    if start != len(payload):
        raise ProtocolError("blob lengths do not add up to the frame length")
    return header, blobs


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], list[bytes]]:
    """Read one frame; raises asyncio.IncompleteReadError on EOF."""
    (length,) = _U32.unpack(await reader.readexactly(_U32.size))
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes is too large")
    return decode(await reader.readexactly(length))


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise EOFError("peer closed the connection")
        got += n
    return bytes(buf)


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], list[bytes]]:
    """Blocking read of one frame (the worker side); raises EOFError when the frontend is gone."""
    (length,) = _U32.unpack(_recv_exactly(sock, _U32.size))
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes is too large")
    return decode(_recv_exactly(sock, length))
