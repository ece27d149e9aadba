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

On the wire each is one frame of ``servetune.server.protocol``: a small JSON header (with ``type``) and the request
bodies or answers as raw blobs, never pickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servetune.api.types import InferRequest, Input
from servetune.handlers.control import Control
from servetune.handlers.spec import CpuSettings, WorkerSpec
from servetune.server.protocol import ProtocolError, encode


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
                "control": r.control.to_json(),
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
    "Answer",
    "Load",
    "LoadError",
    "Message",
    "Partial",
    "Predict",
    "Ready",
    "Result",
    "decode_message",
    "decode_typed",
]
