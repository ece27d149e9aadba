"""The frontend <-> worker wire format: length-prefixed frames over a socket pair.

    frame   := u32 payload_length | payload
    payload := u32 header_length | header (UTF-8 JSON object) | blob_0 | blob_1 | ...

The header lists the blob lengths under ``"_blobs"``; bodies travel as raw bytes, never pickled. What the
headers say is typed in ``servetune.server.messages`` (frontend <-> worker) and ``servetune.server.fork_messages``
(frontend <-> a model's worker parent). A frame may carry file descriptors (SCM_RIGHTS): its header counts them
under ``"_fds"``, and :class:`FrameBuffer` hands each frame its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
from collections import deque
from collections.abc import Iterable
from typing import Any

import orjson

from servetune._exceptions import WorkerError

_U32 = struct.Struct("!I")
_TWO_U32 = struct.Struct("!II")
MAX_FRAME = 1 << 31
_CHUNK = 1 << 16  # what a blocking reader asks the socket for at once: a whole small frame in one recv


def _dumps(header: dict[str, Any]) -> bytes:
    # orjson: the frame header is on every request's path, there and back; several times faster than json. A value
    # it refuses (an integer past 64 bits, a lone surrogate) goes through json, which every reader also reads.
    try:
        return orjson.dumps(header)
    except TypeError:
        return json.dumps(header, separators=(",", ":")).encode()


def _loads(data: bytes | memoryview) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data))  # what orjson refuses but json wrote (a lone surrogate's escape)


class ProtocolError(WorkerError):
    """The peer sent something that is not a frame (or a frame that is not a message)."""


def encode(header: dict[str, Any], blobs: list[bytes] | None = None, fds: int = 0) -> bytes:
    """One frame; ``fds``: how many file descriptors are sent with it (``sendmsg``'s ancillary data)."""
    blobs = blobs or []
    head = _dumps({**header, "_blobs": [len(b) for b in blobs], **({"_fds": fds} if fds else {})})
    payload_len = _U32.size + len(head) + sum(len(b) for b in blobs)
    return b"".join([_TWO_U32.pack(payload_len, len(head)), head, *blobs])


def decode(payload: bytes | bytearray | memoryview) -> tuple[dict[str, Any], list[bytes]]:
    """A frame's payload (without its length): the header and the blobs, each blob its own ``bytes``."""
    view = memoryview(payload)
    (head_len,) = _U32.unpack_from(view, 0)
    start = _U32.size + head_len
    if start > len(view):
        raise ProtocolError("header longer than the frame")
    try:
        header: dict[str, Any] = _loads(view[_U32.size : start])
    except ValueError as exc:
        raise ProtocolError(f"the frame's header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("the frame's header is not a JSON object")
    blobs: list[bytes] = []
    for size in header.pop("_blobs", []):
        blobs.append(bytes(view[start : start + size]))
        start += size
    if start != len(view):
        raise ProtocolError("blob lengths do not add up to the frame length")
    return header, blobs


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], list[bytes]]:
    """Read one frame; raises asyncio.IncompleteReadError on EOF."""
    (length,) = _U32.unpack(await reader.readexactly(_U32.size))
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes is too large")
    return decode(await reader.readexactly(length))


class SocketFrames:
    """Frames read from a blocking socket (the worker side), with one ``recv`` per small frame (rather than one for
    its length and one for the rest): what one ``recv`` brings beyond a frame is kept for the next."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._data = bytearray()

    def next(self) -> tuple[dict[str, Any], list[bytes]]:
        """The next frame; raises EOFError when the peer is gone, ProtocolError for a frame too large."""
        data = self._data
        while len(data) < _U32.size:
            self._fill()
        (length,) = _U32.unpack_from(data, 0)
        if length > MAX_FRAME:
            raise ProtocolError(f"frame of {length} bytes is too large")
        end = _U32.size + length
        if len(data) >= end:
            with memoryview(data) as view:
                frame = decode(view[_U32.size : end])
            del data[:end]
            return frame
        if end - len(data) <= _CHUNK:
            while len(data) < end:
                self._fill()
            return self.next()
        # A large frame (an image, a spec): the rest is read straight into its place, not through the buffer.
        payload = bytearray(length)
        have = len(data) - _U32.size
        payload[:have] = memoryview(data)[_U32.size :]
        data.clear()
        with memoryview(payload) as view:
            got = have
            while got < length:
                n = self._sock.recv_into(view[got:], length - got)
                if n == 0:
                    raise EOFError("peer closed the connection")
                got += n
            return decode(view)

    def _fill(self) -> None:
        chunk = self._sock.recv(_CHUNK)
        if not chunk:
            raise EOFError("peer closed the connection")
        self._data += chunk


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


class FrameBuffer:
    """Frames read in chunks, with the file descriptors that came with them. A frame whose header says
    ``"_fds": n`` takes the next ``n`` descriptors received, in order: the kernel delivers a descriptor with the bytes
    of the ``sendmsg`` that sent it, so no later than the first byte of its frame. Descriptors nobody took are closed
    by :meth:`close`."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._fds: deque[int] = deque()

    def feed(self, data: bytes, fds: Iterable[int] = ()) -> None:
        self._data += data
        self._fds.extend(fds)

    def next_frame(self) -> tuple[dict[str, Any], list[bytes], list[int]] | None:
        """The next whole frame (header, blobs, descriptors), or None until more bytes come."""
        if len(self._data) < _U32.size:
            return None
        (length,) = _U32.unpack_from(self._data, 0)
        if length > MAX_FRAME:
            raise ProtocolError(f"frame of {length} bytes is too large")
        end = _U32.size + length
        if len(self._data) < end:
            return None
        payload = bytes(self._data[_U32.size : end])
        del self._data[:end]
        header, blobs = decode(payload)
        count = header.pop("_fds", 0)
        if not isinstance(count, int) or count < 0 or count > len(self._fds):
            raise ProtocolError(f"frame says it carries {count!r} file descriptors, {len(self._fds)} came")
        return header, blobs, [self._fds.popleft() for _ in range(count)]

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popleft())


def recv_chunk(sock: socket.socket, size: int = 1 << 16) -> tuple[bytes, list[int]]:
    """Whatever the socket has (b"" at EOF), with the descriptors that came with it; raises BlockingIOError on a
    non-blocking socket with nothing to read."""
    data, fds, flags, _ = socket.recv_fds(sock, size, 16)
    if flags & socket.MSG_CTRUNC:
        for fd in fds:
            os.close(fd)
        raise ProtocolError("more file descriptors came with a frame than one reads at once")
    return data, list(fds)
