"""The bodies that carry OIP tensors over REST: an inference request or response as JSON, or as JSON followed by
binary tensor data (the binary tensor data extension: the JSON part's length in ``Inference-Header-Content-Length``,
each binary tensor's size in its ``binary_data_size`` parameter), parsed into and encoded from
:class:`InferenceRequest` and :class:`InferenceResponse`. One tensor's data: ``servetune.tensors.datatypes``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servetune.tensor_limits import DEFAULT_LIMITS, NO_LIMITS, TensorError, TensorLimits, strict_json
from servetune.tensors.datatypes import DATATYPES, Tensor, _is_int, decode_binary_data, decode_json_data

HEADER_LENGTH = "Inference-Header-Content-Length"  # the binary extension's header: the JSON part's length in bytes


@dataclass
class RequestedOutput:
    """An output a request asks for: ``parameters["binary_data"]`` asks for it in binary."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferenceRequest:
    """``$inference_request``: the inputs, and optionally an id, parameters and the outputs wanted."""

    inputs: list[Tensor]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[RequestedOutput] = field(default_factory=list)

    def input(self, name: str) -> Tensor:
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        raise KeyError(name)

    def binary_output(self, name: str) -> bool:
        """Whether output ``name`` is to be sent in binary: its own ``binary_data``, else ``binary_data_output``."""
        default = bool(self.parameters.get("binary_data_output", False))
        for wanted in self.outputs:
            if wanted.name == name:
                return bool(wanted.parameters.get("binary_data", default))
        return default


@dataclass
class InferenceResponse:
    """``$inference_response``."""

    model_name: str
    outputs: list[Tensor]
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


# ---- requests and responses --------------------------------------------------------------------


def split_body(body: bytes | bytearray | memoryview, header_length: int | None) -> tuple[dict[str, Any], memoryview]:
    """The JSON part of a body (an object) and the binary part after it."""
    view = memoryview(body).cast("B")
    if header_length is None:
        header_length = len(view)
    elif not 0 <= header_length <= len(view):
        raise TensorError(f"{HEADER_LENGTH}: {header_length} is not within the body's {len(view)} bytes")
    try:
        header = strict_json(bytes(view[:header_length]))
    except (ValueError, RecursionError) as exc:
        raise TensorError(f"the body is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise TensorError(f"the body must be a JSON object, got {type(header).__name__}")
    return header, view[header_length:]


_MAX_LENGTH_DIGITS = 18  # more than any body a server accepts, and int() never sees thousands of digits


def parse_header_length(value: str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` header's value (None when absent): ASCII digits only (``"²"`` passes
    ``str.isdigit`` but is no length)."""
    if value is None:
        return None
    digits = value.strip()
    if not digits or len(digits) > _MAX_LENGTH_DIGITS or not all("0" <= c <= "9" for c in digits):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise TensorError(f"{HEADER_LENGTH}: {shown!r} is not a length in bytes")
    return int(digits)


def parse_request(
    body: bytes | bytearray | memoryview, header_length: int | None = None, limits: TensorLimits = DEFAULT_LIMITS
) -> InferenceRequest:
    """A REST inference request: JSON, or JSON then binary tensor data (``header_length`` given); every input is
    checked against ``limits`` before its data is decoded."""
    header, tail = split_body(body, header_length)
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise TensorError("inputs: expected a non-empty list of tensors")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise TensorError(f"id: expected a string, got {request_id!r}")
    reader = _Tail(tail)
    inputs = [_input(raw, i, reader, limits=limits) for i, raw in enumerate(raw_inputs)]
    reader.finish()
    _unique("inputs", [t.name for t in inputs])
    outputs = [_requested(raw, i) for i, raw in enumerate(_list(header.get("outputs"), "outputs"))]
    _unique("outputs", [o.name for o in outputs])
    return InferenceRequest(inputs, request_id, _parameters(header.get("parameters"), "parameters"), outputs)


def encode_request(request: InferenceRequest, *, binary: bool = True) -> tuple[bytes, int | None]:
    """A REST body for ``request``: every input in binary (with the header length to send), or all JSON."""
    header: dict[str, Any] = {}
    if request.id is not None:
        header["id"] = request.id
    if request.parameters:
        header["parameters"] = request.parameters
    tails = [t.to_bytes() for t in request.inputs] if binary else []
    header["inputs"] = [t._entry(len(tails[i]) if binary else None) for i, t in enumerate(request.inputs)]
    if request.outputs:
        header["outputs"] = [
            {"name": o.name, **({"parameters": o.parameters} if o.parameters else {})} for o in request.outputs
        ]
    return _frame(header, tails)


def parse_response(body: bytes | bytearray | memoryview, header_length: int | None = None) -> InferenceResponse:
    """A REST inference response (what a client reads back)."""
    header, tail = split_body(body, header_length)
    reader = _Tail(tail)
    outputs = [
        _input(raw, i, reader, what="outputs", limits=NO_LIMITS)
        for i, raw in enumerate(_list(header.get("outputs"), "outputs"))
    ]
    reader.finish()
    return InferenceResponse(
        str(header.get("model_name", "")),
        outputs,
        header.get("model_version"),
        header.get("id"),
        _parameters(header.get("parameters"), "parameters"),
    )


def encode_response(response: InferenceResponse, request: InferenceRequest | None = None) -> tuple[bytes, int | None]:
    """A REST body for ``response`` and the header length to send (None: plain JSON). Only the outputs the request
    names are sent, in its order (all when it names none), each in binary when it asks so; a BYTES output that is not
    UTF-8 text is sent in binary rather than failed."""
    outputs = response.outputs
    if request is not None and request.outputs:
        produced = {t.name: t for t in response.outputs}
        missing = [o.name for o in request.outputs if o.name not in produced]
        if missing:
            raise TensorError(f"outputs {missing}: requested, but the model produced {sorted(produced)}")
        outputs = [produced[o.name] for o in request.outputs]
    header: dict[str, Any] = {"model_name": response.model_name}
    if response.model_version is not None:
        header["model_version"] = response.model_version
    header["id"] = response.id if response.id is not None else ""
    if response.parameters:
        header["parameters"] = response.parameters
    entries, tails = [], []
    for tensor in outputs:
        binary = request.binary_output(tensor.name) if request is not None else False
        if not binary and not _json_safe(tensor):
            binary = True  # NaN and infinities are not JSON: this output goes in binary, exact
        if not binary:
            try:
                entries.append(tensor._entry(None))
                continue
            except TensorError:
                pass  # not UTF-8: binary after all
        tails.append(tensor.to_bytes())
        entries.append(tensor._entry(len(tails[-1])))
    header["outputs"] = entries
    return _frame(header, tails)


# ---- internals ---------------------------------------------------------------------------------


def _json_safe(tensor: Tensor) -> bool:
    """Whether JSON can carry the tensor's values (floats: only finite ones)."""
    data = tensor.data
    return data.dtype.kind != "f" or data.size == 0 or bool(np.isfinite(data).all())


def _frame(header: dict[str, Any], tails: list[bytes]) -> tuple[bytes, int | None]:
    text = json.dumps(header, separators=(",", ":")).encode()
    return (text + b"".join(tails), len(text)) if tails else (text, None)


class _Tail:
    """The binary part of a body, handed out in order to the tensors that declare ``binary_data_size``."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def take(self, name: str, size: Any) -> memoryview:
        if not _is_int(size) or size < 0:
            raise TensorError(f"input {name!r}: binary_data_size={size!r}: expected a size in bytes")
        if self.pos + size > len(self.view):
            raise TensorError(
                f"input {name!r}: binary_data_size={size} but only {len(self.view) - self.pos} bytes of binary "
                "data are left in the body"
            )
        chunk = self.view[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def finish(self) -> None:
        if self.pos != len(self.view):
            raise TensorError(
                f"the body has {len(self.view)} bytes of binary data but binary_data_size adds up to {self.pos} "
                f"(check {HEADER_LENGTH})"
            )


def _input(raw: Any, index: int, tail: _Tail, what: str = "inputs", limits: TensorLimits = DEFAULT_LIMITS) -> Tensor:
    if not isinstance(raw, dict):
        raise TensorError(f"{what}[{index}]: expected an object, got {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise TensorError(f"{what}[{index}]: name: expected a non-empty string")
    datatype = raw.get("datatype")
    if datatype not in DATATYPES:
        raise TensorError(f"{what}[{index}] {name!r}: datatype={datatype!r}: expected one of {', '.join(DATATYPES)}")
    shape = raw.get("shape")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= -1 for d in shape):
        raise TensorError(f"{what}[{index}] {name!r}: shape={shape!r}: expected a list of sizes")
    parameters = _parameters(raw.get("parameters"), f"{what}[{index}].parameters")
    size = parameters.pop("binary_data_size", None)
    if size is not None:
        if "data" in raw:
            raise TensorError(f"{what}[{index}] {name!r}: has both data and binary_data_size")
        limits.check(name, shape)  # before the bytes are taken
        tensor = decode_binary_data(name, str(datatype), shape, tail.take(name, size), limits)
    elif "data" in raw:
        tensor = decode_json_data(name, str(datatype), shape, raw["data"], limits)
    else:
        raise TensorError(f"{what}[{index}] {name!r}: no data and no binary_data_size")
    tensor.parameters = parameters
    return tensor


def _requested(raw: Any, index: int) -> RequestedOutput:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise TensorError(f"outputs[{index}]: expected {{name, parameters?}}, got {raw!r}")
    return RequestedOutput(raw["name"], _parameters(raw.get("parameters"), f"outputs[{index}].parameters"))


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TensorError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TensorError(f"{where}: expected an object, got {type(value).__name__}")
    return dict(value)


def _unique(where: str, names: Iterable[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise TensorError(f"{where}: {name!r} appears twice")
        seen.add(name)


__all__ = [
    "HEADER_LENGTH",
    "InferenceRequest",
    "InferenceResponse",
    "RequestedOutput",
    "encode_request",
    "encode_response",
    "parse_header_length",
    "parse_request",
    "parse_response",
    "split_body",
]
