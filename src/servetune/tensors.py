"""Tensors of the Open Inference Protocol (KServe v2): datatypes, their JSON and binary forms, requests and responses.

One codec for every place that handles OIP tensors: the REST API (JSON bodies and the binary tensor data extension),
the gRPC API (typed ``contents`` and ``raw_input_contents`` are the binary form below), the worker-side envelopes
that hand tensors to handlers, and the load generator. numpy only; no HTTP, no protobuf.

A :class:`Tensor` holds a C-ordered numpy array of its shape: BYTES elements are ``bytes`` in an object array; BF16
(which numpy lacks) is held as float32 and rounded to bfloat16 when encoded. JSON data may be nested or flat; the
element count must equal the shape's product (one dimension may be ``-1`` in a request: inferred from the data, as
numpy's reshape does, for TorchServe's own samples). Binary data is little-endian, row-major, unpadded; BOOL is one
byte; a BYTES element is a 4-byte little-endian length then its bytes. Every error is a :class:`TensorError` whose
message names the tensor and what was expected: a server answers it 400.

Limits (``servetune.tensor_limits``, the server's ``max_tensor_*`` keys) are checked on a tensor's shape before any
of its data is decoded; over one: ``TensorLimitError`` (a server answers 413). JSON is strict: ``NaN`` and
``Infinity`` are not JSON, and a number a datatype cannot hold (FP16 ``1e10``) is refused rather than made infinite.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servetune.tensor_limits import (
    DEFAULT_LIMITS,
    NO_LIMITS,
    TensorError,
    TensorLimitError,
    TensorLimits,
    strict_json,
)

HEADER_LENGTH = "Inference-Header-Content-Length"  # the binary extension's header: the JSON part's length in bytes
BINARY_PARAMETERS = ("binary_data_size", "binary_data", "binary_data_output")  # the extension's own parameters

_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(np.float32),  # held as float32 (numpy has no bfloat16); two bytes on the wire
    "BYTES": np.dtype(object),
}
DATATYPES: tuple[str, ...] = tuple(_DTYPES)
_WIRE_SIZE = {name: (2 if name == "BF16" else dtype.itemsize) for name, dtype in _DTYPES.items() if name != "BYTES"}
_BY_DTYPE = {dtype: name for name, dtype in _DTYPES.items() if name not in ("BF16", "BYTES")}
_LENGTH = struct.Struct("<I")
_BF16_OVERFLOW = 3.3961775292304e38  # float32 values from here on round to bfloat16's infinity


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype a tensor of ``datatype`` is held in (BYTES: object; BF16: float32)."""
    try:
        return _DTYPES[datatype]
    except KeyError:
        raise TensorError(f"datatype {datatype!r}: expected one of {', '.join(DATATYPES)}") from None


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The OIP datatype of a numpy dtype: strings, bytes and objects are BYTES."""
    found = _BY_DTYPE.get(np.dtype(dtype).newbyteorder("="))
    if found is not None:
        return found
    if dtype.kind in "OUS":
        return "BYTES"
    raise TensorError(f"numpy dtype {dtype} has no Open Inference Protocol datatype")


@dataclass(frozen=True)
class TensorMetadata:
    """A tensor a model declares: ``-1`` marks a dimension of any size."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> TensorMetadata:
        """Read ``{"name", "datatype", "shape"}``; raises TensorError naming ``where``."""
        if not isinstance(raw, Mapping):
            raise TensorError(f"{where}: expected {{name, datatype, shape}}, got {raw!r}")
        name, datatype, shape = raw.get("name"), raw.get("datatype"), raw.get("shape")
        if not isinstance(name, str) or not name:
            raise TensorError(f"{where}: name={name!r}: expected a non-empty string")
        if datatype not in _DTYPES:
            raise TensorError(f"{where}: datatype={datatype!r}: expected one of {', '.join(DATATYPES)}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= -1 for d in shape):
            raise TensorError(f"{where}: shape={shape!r}: expected a list of sizes (-1: any size)")
        return cls(name, str(datatype), tuple(shape))


@dataclass
class Tensor:
    """A named tensor: ``data`` is a numpy array of ``shape`` (see the module docstring for BYTES and BF16)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray[Any, Any]
    parameters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_array(
        cls, name: str, value: Any, datatype: str | None = None, parameters: Mapping[str, Any] | None = None
    ) -> Tensor:
        """A tensor from a numpy array, a torch tensor, a list or a scalar; the datatype is the array's unless
        given. Strings become UTF-8 BYTES elements."""
        array, implied = _as_array(value, name)
        datatype = datatype or implied
        dtype = numpy_dtype(datatype)
        if datatype == "BYTES":
            array = _bytes_array(array, name)
        elif array.dtype.kind in "OUS":
            raise TensorError(f"tensor {name!r}: {datatype} data holds strings or objects")
        else:
            array = np.asarray(array, dtype=dtype, order="C")
        return cls(name, datatype, tuple(int(d) for d in array.shape), array, dict(parameters or {}))

    def metadata(self) -> TensorMetadata:
        return TensorMetadata(self.name, self.datatype, self.shape)

    def to_bytes(self) -> bytes:
        """The binary form (the binary extension's, and gRPC's ``raw_input_contents``/``raw_output_contents``)."""
        flat = self.data.reshape(-1)
        if self.datatype == "BYTES":
            pack = _LENGTH.pack
            return b"".join([pack(len(item)) + item for item in flat.tolist()])
        if self.datatype == "BF16":
            bits = np.ascontiguousarray(flat, dtype=np.float32).view(np.uint32)
            rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
            return rounded.astype("<u2").tobytes()
        return np.ascontiguousarray(flat, dtype=self.data.dtype.newbyteorder("<")).tobytes()

    def to_list(self) -> list[Any]:
        """The JSON form: a flat list (BYTES as UTF-8 strings; raises TensorError if an element is not UTF-8)."""
        flat = self.data.reshape(-1)
        if self.datatype != "BYTES":
            return flat.tolist()  # type: ignore[no-any-return]
        try:
            return [item.decode("utf-8") for item in flat]
        except UnicodeDecodeError:
            raise TensorError(f"tensor {self.name!r}: a BYTES element is not UTF-8 text; send it binary") from None

    def to_json(self, *, binary: bool = False) -> dict[str, Any]:
        """This tensor as a request input or response output object (``binary``: its data goes after the JSON)."""
        return self._entry(len(self.to_bytes()) if binary else None)

    def _entry(self, binary_size: int | None) -> dict[str, Any]:
        raw: dict[str, Any] = {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}
        parameters = {k: v for k, v in self.parameters.items() if k not in BINARY_PARAMETERS}
        if binary_size is not None:
            parameters["binary_data_size"] = binary_size
        else:
            raw["data"] = self.to_list()
        if parameters:
            raw["parameters"] = parameters
        return raw


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


# ---- data --------------------------------------------------------------------------------------


def decode_json_data(
    name: str, datatype: str, shape: Sequence[int], data: Any, limits: TensorLimits = DEFAULT_LIMITS
) -> Tensor:
    """A tensor from its JSON ``data`` (nested or flat; one ``-1`` in ``shape`` is inferred)."""
    dtype = numpy_dtype(datatype)
    limits.check(name, shape)
    if not isinstance(data, list):
        raise TensorError(f"input {name!r}: data: expected a list, got {type(data).__name__}")
    if datatype == "BYTES":
        flat = _flatten(data)
        if not all(isinstance(item, str) for item in flat):
            raise TensorError(f"input {name!r}: BYTES data: expected strings")
        array = np.empty(len(flat), dtype=object)
        try:
            array[:] = [item.encode("utf-8") for item in flat]
        except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800") is valid JSON but not Unicode text
            raise TensorError(f"input {name!r}: a BYTES string is not valid Unicode text ({exc.reason})") from None
    else:
        array = _numeric(name, datatype, dtype, data)
    return _shaped(name, datatype, shape, array, limits)


def decode_binary_data(
    name: str,
    datatype: str,
    shape: Sequence[int],
    raw: bytes | bytearray | memoryview,
    limits: TensorLimits = DEFAULT_LIMITS,
) -> Tensor:
    """A tensor from its binary form (zero-copy over ``raw`` where the dtype allows; writable over a bytearray)."""
    dtype = numpy_dtype(datatype)
    limits.check(name, shape)
    view = memoryview(raw).cast("B")
    if datatype == "BYTES":
        items = _bytes_elements(name, view)
        array = np.empty(len(items), dtype=object)
        array[:] = items
    else:
        size = _WIRE_SIZE[datatype]
        if len(view) % size:
            raise TensorError(f"input {name!r}: {len(view)} bytes of {datatype} data is not a whole number of elements")
        if datatype == "BF16":
            array = (np.frombuffer(view, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif datatype == "BOOL":
            array = np.frombuffer(view, np.uint8) != 0
        else:
            array = np.frombuffer(view, dtype.newbyteorder("<"))
            if array.dtype != dtype:  # a big-endian host
                array = array.astype(dtype)
    return _shaped(name, datatype, shape, array, limits)


def _bytes_elements(name: str, view: memoryview) -> list[bytes]:
    """The elements of binary BYTES data (each a 4-byte little-endian length, then its bytes). Sliced from one
    ``bytes`` copy, with the lookups hoisted: about five times faster than slicing the memoryview (a million
    one-byte elements is a 6 MB request)."""
    data = view.tobytes()
    items: list[bytes] = []
    append, unpack = items.append, _LENGTH.unpack_from
    pos, end = 0, len(data)
    while pos < end:
        if pos + 4 > end:
            raise TensorError(f"input {name!r}: BYTES data is truncated (an element's 4-byte length)")
        (length,) = unpack(data, pos)
        pos += 4
        following = pos + length
        if following > end:
            raise TensorError(f"input {name!r}: BYTES data is truncated (an element of {length} bytes)")
        append(data[pos:following])
        pos = following
    return items


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
    if datatype not in _DTYPES:
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shaped(name: str, datatype: str, shape: Sequence[int], flat: np.ndarray[Any, Any], limits: TensorLimits) -> Tensor:
    resolved = _resolve(name, shape, flat.size)
    if -1 in shape:
        limits.check(name, resolved)
    return Tensor(name, datatype, resolved, flat.reshape(resolved))


def _resolve(name: str, shape: Sequence[int], count: int) -> tuple[int, ...]:
    """``shape`` with its ``-1`` (at most one) inferred from ``count``; the product must equal ``count``."""
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1:
        raise TensorError(f"input {name!r}: shape {list(shape)} has more than one -1")
    known = math.prod(d for d in shape if d != -1)
    resolved = list(shape)
    if unknown:
        if known == 0 or count % known:
            raise TensorError(f"input {name!r}: {count} elements do not fit shape {list(shape)}")
        resolved[unknown[0]] = count // known
    elif known != count:
        raise TensorError(f"input {name!r}: shape {list(shape)} holds {known} elements but the data has {count}")
    return tuple(resolved)


def _flatten(data: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _numeric(name: str, datatype: str, dtype: np.dtype[Any], data: list[Any]) -> np.ndarray[Any, Any]:
    """JSON numbers (or booleans for BOOL) as a flat array of ``dtype``, refusing values the type cannot hold."""
    try:
        array = np.asarray(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise TensorError(f"input {name!r}: data is not a rectangular array of {datatype} values ({exc})") from None
    kind = array.dtype.kind
    if dtype.kind in "iu" and kind in "fO":  # integers beyond int64 make numpy guess float or object
        flat = _flatten(data)
        if flat and all(_is_int(v) for v in flat):
            info = np.iinfo(dtype)
            if not all(info.min <= v <= info.max for v in flat):
                raise TensorError(f"input {name!r}: a value is outside {datatype}'s range [{info.min}, {info.max}]")
            return np.array(flat, dtype=dtype)
    if array.size == 0:
        return np.empty(0, dtype=dtype)
    if datatype == "BOOL":
        ok = kind == "b"
    elif dtype.kind in "iu":
        ok = kind in "iu"
    else:
        ok = kind in "iuf"
    if not ok:
        raise TensorError(f"input {name!r}: data holds {_kind_name(kind)}, not {datatype} values")
    if dtype.kind in "iu" and array.dtype != dtype:
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise TensorError(f"input {name!r}: a value is outside {datatype}'s range [{info.min}, {info.max}]")
    with np.errstate(over="ignore"):  # an overflow is refused below, by name
        out = array.reshape(-1).astype(dtype, copy=False)
    if datatype in ("FP16", "FP32", "BF16") and out.size:
        # JSON holds no infinity: a number too large for the type is refused, not made infinite
        top = np.abs(out).max()
        if np.isinf(top) or (datatype == "BF16" and top >= _BF16_OVERFLOW):
            raise TensorError(f"input {name!r}: a value is outside {datatype}'s finite range")
    return out


def _kind_name(kind: str) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "U": "strings", "S": "bytes"}.get(
        kind, "mixed values"
    )


def _as_array(value: Any, name: str) -> tuple[np.ndarray[Any, Any], str]:
    """``value`` as a numpy array and its implied datatype (torch tensors detached and moved to the CPU)."""
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            return tensor.float().numpy(), "BF16"
        value = tensor.numpy()
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise TensorError(f"tensor {name!r}: not an array ({exc})") from None
    return array, datatype_of(array.dtype)


def _bytes_array(array: np.ndarray[Any, Any], name: str) -> np.ndarray[Any, Any]:
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1)):
        if isinstance(item, (bytes, bytearray, memoryview)):
            flat[i] = bytes(item)
        elif isinstance(item, str):
            flat[i] = item.encode("utf-8")
        else:
            raise TensorError(f"tensor {name!r}: a BYTES element is a {type(item).__name__}, not str or bytes")
    return out


__all__ = [
    "BINARY_PARAMETERS",
    "DATATYPES",
    "DEFAULT_LIMITS",
    "NO_LIMITS",
    "HEADER_LENGTH",
    "InferenceRequest",
    "InferenceResponse",
    "RequestedOutput",
    "Tensor",
    "TensorError",
    "TensorLimitError",
    "TensorLimits",
    "TensorMetadata",
    "datatype_of",
    "decode_binary_data",
    "decode_json_data",
    "encode_request",
    "encode_response",
    "numpy_dtype",
    "parse_header_length",
    "parse_request",
    "parse_response",
    "split_body",
    "strict_json",
]
