"""The frontend <-> worker messages, typed: what each side may send and every field it carries.

    frontend -> worker   Load      the model to load and how (the WorkerSpec): the first frame, once
                         Predict   a batch (requests with their inputs and typed control: protocol, explain,
                                   describe), the batch size and CPU settings to use
    worker -> frontend   Ready     the model loaded (pid, load time, CPU settings as applied, the handler's OIP
                                   metadata)
                         LoadError the model could not load (the handler's message and traceback)
                         Partial   one intermediate answer to one request of the running batch (the handler
                                   called ``send_intermediate_predict_response``); any number, before its Result
                         Result    one answer per request of the batch, the handler's time, GPU memory, CPU settings

On the wire each is one frame: a small JSON header (with ``type``) and the request bodies or answers as raw blobs,
never pickled. Frames are length-prefixed, over a socket pair:

    frame   := u32 payload_length | payload
    payload := u32 header_length | header (UTF-8 JSON object) | blob_0 | blob_1 | ...

The header lists the blob lengths under ``"_blobs"``. ``servetune.server.fork_messages`` types the frontend <-> a
model's worker parent messages over the same frames. A frame may carry file descriptors (SCM_RIGHTS): its header
counts them under ``"_fds"``, and :class:`FrameBuffer` hands each frame its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import orjson

from servetune._exceptions import WorkerError
from servetune.api.types import InferRequest, Input
from servetune.handlers.control import Control
from servetune.handlers.spec import CpuSettings, WorkerSpec

# ---- frames --------------------------------------------------------------------------------------------------------

_U32 = struct.Struct("!I")
_TWO_U32 = struct.Struct("!II")
MAX_FRAME = 1 << 31
_CHUNK = 1 << 16  # what a blocking reader asks the socket for at once: a whole small frame in one recv


def _dumps(header: dict[str, Any]) -> bytes:
    # orjson: the frame header is on every request's path, there and back; several times faster than json. A value
    # it refuses (an integer past 64 bits, a lone surrogate) goes through json, whose text starts with a space (still
    # JSON): its reader reads it with json too, since orjson would read such an integer as a float.
    try:
        return orjson.dumps(header)
    except TypeError:
        return b" " + json.dumps(header, separators=(",", ":")).encode()


def _loads(data: bytes | memoryview) -> Any:
    if data[:1] == b" ":  # written by json (``_dumps``)
        return json.loads(bytes(data))
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data))  # not ours: what orjson refuses, json may read


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


class FrameProtocol(asyncio.Protocol):
    """The event loop's end of a frame socket (the frontend's, to a worker): each whole frame is decoded in the
    loop's read callback and handed to ``on_frame`` there, with no reader task and no stream between (a worker's
    answer resolves its batch's future from the callback itself); ``on_lost(error)`` once the connection ends:
    None at EOF, the ProtocolError of a malformed frame (the connection is then closed), or the transport's error.
    :meth:`send` writes a frame, :meth:`drain` waits while the transport's buffer is over its high-water mark."""

    def __init__(
        self,
        on_frame: Callable[[dict[str, Any], list[bytes]], None],
        on_lost: Callable[[BaseException | None], None],
    ) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._frames = FrameBuffer()
        self._error: BaseException | None = None
        self._lost = False
        self._resumed: asyncio.Future[None] | None = None  # set while writing is paused
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        if self._error is not None:
            return
        frames = self._frames
        frames.feed(data)
        try:
            while (frame := frames.next_frame()) is not None:
                self._on_frame(frame[0], frame[1])
        except ProtocolError as exc:  # a frame that is not one, or (from on_frame) not a message
            self._error = exc
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._frames.close()
        self.resume_writing()
        self._on_lost(self._error or exc)

    def pause_writing(self) -> None:
        if self._resumed is None:
            self._resumed = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        resumed, self._resumed = self._resumed, None
        if resumed is not None and not resumed.done():
            resumed.set_result(None)

    def send(self, frame: bytes) -> None:
        """Write a frame; ConnectionResetError once the connection is gone or closing."""
        if self._lost or self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        self.transport.write(frame)

    async def drain(self) -> None:
        """Wait while the transport's buffer is full; ConnectionResetError if the connection goes meanwhile."""
        if self._resumed is not None:
            await asyncio.shield(self._resumed)
        if self._lost:
            raise ConnectionResetError("the connection is closed")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


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


# ---- messages -----------------------------------------------------------------------------------------------------


def _cpu(raw: dict[str, Any] | None) -> CpuSettings | None:
    if not raw:
        return None
    return CpuSettings(int(raw["num_threads"]), int(raw["inter_op_threads"]), tuple(raw["cpu_cores"]))


@dataclass(slots=True)
class Load:
    """What the worker loads (sent over the socket: a spec can be larger than a command line may be)."""

    spec: WorkerSpec

    def encode(self) -> bytes:
        return encode({"type": "load", "spec": self.spec.to_json()})

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> Load:
        return cls(WorkerSpec.from_json(header["spec"]))


@dataclass(slots=True)
class Predict:
    requests: list[InferRequest]
    batch_size: int  # the handler's context ``system_properties["batch_size"]`` (changed in place by the API)
    num_threads: int  # intra-op threads to run with (the frontend shares the cores anew after scaling)
    cpu_cores: tuple[int, ...]  # the cores to run on; (): not pinned

    def encode(self) -> bytes:
        items = [
            {
                "id": r.request_id,
                "headers": r.headers,
                "inputs": [[i.name, i.content_type] for i in r.inputs],
                "control": r.control.key,
            }
            for r in self.requests
        ]
        header = {
            "type": "predict",
            "batch": items,
            "batch_size": self.batch_size,
            "num_threads": self.num_threads,
            "cpu_cores": list(self.cpu_cores),
        }
        return encode(header, [i.data for r in self.requests for i in r.inputs])

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> Predict:
        data = iter(blobs)
        requests = [
            InferRequest(
                item["id"],
                item.get("headers") or {},
                [Input(name, ctype, next(data)) for name, ctype in item["inputs"]],
                0.0,
                control=Control.from_json(item["control"]),
            )
            for item in header["batch"]
        ]
        return cls(requests, int(header["batch_size"]), int(header["num_threads"]), tuple(header["cpu_cores"]))


@dataclass(slots=True)
class Answer:
    """The handler's answer to one request."""

    status: int
    body: bytes
    content_type: str | None
    headers: dict[str, str]


@dataclass(slots=True)
class Result:
    answers: list[Answer]
    handler_ms: float
    gpu_memory_bytes: int  # peak GPU memory the worker's CUDA allocator reserved so far (0: CUDA unused)
    cpu: CpuSettings | None

    def encode(self) -> bytes:
        header = {
            "type": "result",
            "items": [[a.status, a.content_type, a.headers] for a in self.answers],
            "handler_ms": self.handler_ms,
            "gpu_memory": self.gpu_memory_bytes,
            "cpu": self.cpu.to_json() if self.cpu is not None else None,
        }
        return encode(header, [a.body for a in self.answers])

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> Result:
        items = header["items"]
        if len(items) != len(blobs):
            raise ProtocolError(f"result lists {len(items)} answers but carries {len(blobs)} bodies")
        answers = [Answer(int(s), b, c, h or {}) for (s, c, h), b in zip(items, blobs, strict=True)]
        return cls(answers, float(header["handler_ms"]), int(header.get("gpu_memory") or 0), _cpu(header.get("cpu")))


@dataclass(slots=True)
class Partial:
    """An intermediate answer to request ``request_id`` of the batch being run (a streaming handler's)."""

    request_id: str
    answer: Answer

    def encode(self) -> bytes:
        a = self.answer
        header = {"type": "partial", "id": self.request_id, "item": [a.status, a.content_type, a.headers]}
        return encode(header, [a.body])

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> Partial:
        status, content_type, headers = header["item"]
        [body] = blobs
        return cls(str(header["id"]), Answer(int(status), body, content_type, headers or {}))


@dataclass(slots=True)
class Ready:
    pid: int
    load_ms: float
    cpu: CpuSettings | None
    # the worker's start before it loaded its model: exec to servetune's worker module (interpreter), that module's
    # imports (0.0: not reported)
    interpreter_ms: float = 0.0
    imports_ms: float = 0.0
    metadata: dict[str, Any] | None = None  # the handler's ``model_metadata()``, once loaded (None: it has none)

    def encode(self) -> bytes:
        cpu = self.cpu.to_json() if self.cpu is not None else None
        return encode(
            {
                "type": "ready",
                "pid": self.pid,
                "load_ms": self.load_ms,
                "cpu": cpu,
                "interpreter_ms": self.interpreter_ms,
                "imports_ms": self.imports_ms,
                "metadata": self.metadata,
            }
        )

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> Ready:
        metadata = header.get("metadata")
        return cls(
            int(header["pid"]),
            float(header["load_ms"]),
            _cpu(header.get("cpu")),
            float(header.get("interpreter_ms", 0.0)),
            float(header.get("imports_ms", 0.0)),
            metadata if isinstance(metadata, dict) else None,
        )


@dataclass(slots=True)
class LoadError:
    message: str
    traceback: str = ""

    def encode(self) -> bytes:
        return encode({"type": "load_error", "message": self.message, "traceback": self.traceback})

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> LoadError:
        return cls(str(header.get("message", "unknown error")), str(header.get("traceback", "")))


Message = Load | Predict | Result | Partial | Ready | LoadError
_TYPES: dict[str, Any] = {
    "load": Load,
    "predict": Predict,
    "result": Result,
    "partial": Partial,
    "ready": Ready,
    "load_error": LoadError,
}


def decode_typed(types: dict[str, Any], header: dict[str, Any], blobs: list[bytes]) -> Any:
    """The message of ``types`` that ``header["type"]`` names, decoded; ProtocolError for an unknown type or a
    malformed message (a missing or wrong field, a wrong blob count). Both wires' decoder (this one's and the model
    parent's, ``fork_messages``)."""
    kind = types.get(str(header.get("type")))
    if kind is None:
        raise ProtocolError(f"unknown message type {header.get('type')!r}")
    try:
        return kind.decode(header, blobs)
    except (KeyError, TypeError, ValueError, StopIteration) as exc:  # ValueError: also a wrong blob count
        raise ProtocolError(f"malformed {header.get('type')} message: {exc!r}") from None


def decode_message(header: dict[str, Any], blobs: list[bytes]) -> Message:
    message: Message = decode_typed(_TYPES, header, blobs)
    return message


__all__ = [
    "MAX_FRAME",
    "Answer",
    "FrameBuffer",
    "Load",
    "LoadError",
    "Message",
    "Partial",
    "Predict",
    "ProtocolError",
    "Ready",
    "Result",
    "SocketFrames",
    "decode",
    "decode_message",
    "decode_typed",
    "encode",
    "FrameProtocol",
    "recv_chunk",
    "recv_frame",
]
